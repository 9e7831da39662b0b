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
#endif
