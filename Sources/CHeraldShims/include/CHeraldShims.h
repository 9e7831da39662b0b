#ifndef HERALD_SHIMS_H
#define HERALD_SHIMS_H
// Prefixed C wrappers for the macros and variadic functions Swift cannot call. One header per C library (and
// one for the HTTP server's sockets and epoll, one for glibc's malloc_trim).
#include "herald_openssl.h"
#include "herald_http.h"
#include "herald_nghttp2.h"
#include "herald_malloc.h"
#endif
