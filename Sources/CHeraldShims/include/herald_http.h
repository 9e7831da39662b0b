#ifndef HERALD_SHIMS_HTTP_H
#define HERALD_SHIMS_HTTP_H
#include <stddef.h>

/// accept4 (non-blocking, close-on-exec) on `listen_fd`, with TCP_NODELAY set on the new socket (responses go out
/// in one send each; Nagle would only hold back the tail of a partial one). The peer's IP address (without port)
/// is written into `address` (empty when unknown). Returns the descriptor, or -1 with errno (EAGAIN: none waiting).
int herald_http_accept(int listen_fd, char *address, size_t address_size);

/// The current time as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`, 29 bytes) for the Date header, written
/// into `buffer` (at least 30 bytes). Returns the Unix second it describes.
long herald_http_date(char *buffer, size_t size);
#endif
