#ifndef HERALD_SHIMS_EPOLL_H
#define HERALD_SHIMS_EPOLL_H
// epoll and eventfd for Herald's event loops (the HTTP server's worker loops and the APNs client's loop): Swift's
// Glibc module exports neither.

/// A close-on-exec epoll set for an event loop; -1 with errno on failure.
int herald_epoll_create(void);

/// A non-blocking, close-on-exec eventfd to wake that loop; -1 with errno on failure.
int herald_eventfd_create(void);

/// Adds `fd` for readability to the epoll set `epoll_fd` (level-triggered). Returns 0 or -1 with errno.
int herald_epoll_add_readable(int epoll_fd, int fd);

/// Adds a listening socket shared by several loops' epoll sets, level-triggered with EPOLLEXCLUSIVE so a new
/// connection wakes one waiting loop, not all of them. Returns 0 or -1 with errno.
int herald_epoll_add_listener(int epoll_fd, int fd);

/// Adds an accepted connection once for its whole life: edge-triggered readable, writable and peer hang-up, so the
/// steady state needs no further epoll_ctl. Returns 0 or -1 with errno.
int herald_epoll_add_connection(int epoll_fd, int fd);

/// Readiness bits reported by `herald_epoll_wait` and requested from `herald_epoll_watch`.
enum {
    HERALD_EPOLL_READABLE = 1,
    HERALD_EPOLL_WRITABLE = 2,
    /// An error or hang-up on the descriptor (reported only, never requested).
    HERALD_EPOLL_FAILED = 4,
    /// The peer shut down its sending side (EPOLLRDHUP, reported only): what it sent is all in the socket.
    HERALD_EPOLL_PEER_CLOSED = 8,
};

/// Adds `fd` to the epoll set (`add` != 0) or changes its interest, level-triggered, to the HERALD_EPOLL_READABLE /
/// HERALD_EPOLL_WRITABLE bits of `interest`. Returns 0 or -1 with errno.
int herald_epoll_watch(int epoll_fd, int fd, unsigned interest, int add);

/// Removes `fd` from the epoll set. Returns 0 or -1 with errno.
int herald_epoll_unwatch(int epoll_fd, int fd);

/// epoll_wait for at most `timeout_ms`, reporting up to `capacity` ready descriptors in `fds` with their HERALD_EPOLL_*
/// bits in `events`. Returns how many were written, 0 on timeout, -1 with errno.
int herald_epoll_wait(int epoll_fd, int *fds, unsigned *events, int capacity, int timeout_ms);
#endif
