#ifndef HERALD_SHIMS_H
#define HERALD_SHIMS_H
// Prefixed C wrappers for the macros and variadic functions Swift cannot call. One header per C library (and
// one for the event loops' epoll, one for the HTTP server's sockets, one for glibc's malloc_trim, one for the
// fatal-signal handler, one for naming threads).
#include "herald_openssl.h"
#include "herald_epoll.h"
#include "herald_http.h"
#include "herald_malloc.h"
#include "herald_crash.h"
#include "herald_thread.h"
#endif
