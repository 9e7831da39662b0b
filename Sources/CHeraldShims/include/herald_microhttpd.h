#ifndef HERALD_SHIMS_MICROHTTPD_H
#define HERALD_SHIMS_MICROHTTPD_H
#include <stdarg.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <microhttpd.h>
#endif
