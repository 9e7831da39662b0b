// SHA256_Init/Update/Final are deprecated in OpenSSL 3 but are what hashing a few bytes needs: the one-shot
// SHA256() looks the digest up by name (a lock and a table search) and allocates a context on every call.
#define OPENSSL_SUPPRESS_DEPRECATED
#include "herald_openssl.h"
#include <openssl/sha.h>

void herald_sha256(const void *data, size_t length, unsigned char digest[32]) {
    SHA256_CTX context;
    SHA256_Init(&context);
    SHA256_Update(&context, data, length);
    SHA256_Final(digest, &context);
    OPENSSL_cleanse(&context, sizeof(context));
}

int herald_ssl_ctx_set_min_proto_version(SSL_CTX *ctx, int version) {
    return (int)SSL_CTX_set_min_proto_version(ctx, version);
}

int herald_ssl_set_tlsext_host_name(SSL *ssl, const char *name) {
    return (int)SSL_set_tlsext_host_name(ssl, name);
}

long herald_ssl_ctx_set_mode(SSL_CTX *ctx, long mode) { return SSL_CTX_set_mode(ctx, mode); }

void herald_openssl_free(void *pointer) { OPENSSL_free(pointer); }


static int herald_alpn_select_h2(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                                 const unsigned char *in, unsigned int inlen, void *arg) {
    (void)ssl;
    (void)arg;
    unsigned int index = 0;
    while (index < inlen) {
        unsigned int length = in[index];
        if (index + 1 + length > inlen) break;
        if (length == 2 && in[index + 1] == 'h' && in[index + 2] == '2') {
            *out = in + index + 1;
            *outlen = 2;
            return SSL_TLSEXT_ERR_OK;
        }
        index += 1 + length;
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

void herald_ssl_ctx_require_alpn_h2(SSL_CTX *ctx) { SSL_CTX_set_alpn_select_cb(ctx, herald_alpn_select_h2, NULL); }

void herald_ssl_ctx_set_server_options(SSL_CTX *ctx) {
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
}
