#ifndef HERALD_SHIMS_NGHTTP2_H
#define HERALD_SHIMS_NGHTTP2_H
// The HTTP/2 client's event loop: Swift's Glibc module does not export epoll or eventfd, so they come in here.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <nghttp2/nghttp2.h>
#endif
