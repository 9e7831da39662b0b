#ifndef HERALD_SHIMS_OPENSSL_H
#define HERALD_SHIMS_OPENSSL_H
#include <openssl/ssl.h>

/// SSL_CTX_set_min_proto_version (a macro).
int herald_ssl_ctx_set_min_proto_version(SSL_CTX *ctx, int version);
/// SSL_set_tlsext_host_name (a macro): SNI.
int herald_ssl_set_tlsext_host_name(SSL *ssl, const char *name);
/// SSL_CTX_set_mode (a macro): e.g. partial writes and moving write buffers for non-blocking sockets.
long herald_ssl_ctx_set_mode(SSL_CTX *ctx, long mode);
/// OPENSSL_free (a macro).
void herald_openssl_free(void *pointer);
/// Server side: no renegotiation, no compression (option macros built from SSL_OP_BIT do not import).
void herald_ssl_ctx_set_server_options(SSL_CTX *ctx);
/// Server side: accept only clients that offer ALPN "h2" (others get a fatal no_application_protocol alert).
/// A client that sends no ALPN extension at all is not seen by this callback: check SSL_get0_alpn_selected.
void herald_ssl_ctx_require_alpn_h2(SSL_CTX *ctx);
/// SHA-256 of `length` bytes into `digest`, on a context on the stack: no allocation, no lock.
void herald_sha256(const void *data, size_t length, unsigned char digest[32]);
#endif
