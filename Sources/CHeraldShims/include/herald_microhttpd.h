#ifndef HERALD_SHIMS_MICROHTTPD_H
#define HERALD_SHIMS_MICROHTTPD_H
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <microhttpd.h>

/// Receives one formatted libmicrohttpd log message (no trailing newline).
typedef void (*herald_mhd_log_fn)(void *cls, const char *message);

/// Everything `herald_mhd_start` passes to the variadic MHD_start_daemon. The struct must outlive the daemon:
/// the log trampoline reads `log` and `log_cls` from it for as long as the daemon runs.
struct herald_mhd_options {
    /// MHD_FLAG bits (epoll, internal thread, suspend/resume…).
    unsigned int flags;
    /// A bound, listening socket the daemon takes over (MHD_OPTION_LISTEN_SOCKET).
    int listen_fd;
    /// Idle connections are closed after this many seconds; 0 = never.
    unsigned int connection_timeout_seconds;
    /// Connections beyond this number are refused; must be at least 1.
    unsigned int connection_limit;
    MHD_AccessHandlerCallback access_handler;
    void *access_handler_cls;
    MHD_RequestCompletedCallback request_completed;
    void *request_completed_cls;
    herald_mhd_log_fn log;
    void *log_cls;
    /// Told of every connection opened and closed (MHD_OPTION_NOTIFY_CONNECTION).
    MHD_NotifyConnectionCallback notify_connection;
    void *notify_connection_cls;
};

/// MHD_start_daemon with the options above, for a daemon driven by the caller's own loop (no internal thread). The request path and query arguments are left percent-encoded
/// (an identity unescape callback) so that the router can split the path before decoding its segments.
struct MHD_Daemon *herald_mhd_start(const struct herald_mhd_options *options);

/// The daemon's epoll descriptor (MHD_DAEMON_INFO_EPOLL_FD), to wait on from an outer event loop; -1 if none.
int herald_mhd_epoll_fd(struct MHD_Daemon *daemon);

/// A close-on-exec epoll set for an outer event loop; -1 with errno on failure.
int herald_epoll_create(void);

/// A non-blocking, close-on-exec eventfd to wake that loop; -1 with errno on failure.
int herald_eventfd_create(void);

/// Adds `fd` for readability to the epoll set `epoll_fd` (level-triggered). Returns 0 or -1 with errno.
int herald_epoll_add_readable(int epoll_fd, int fd);

/// Readiness bits reported by `herald_epoll_wait` and requested from `herald_epoll_watch`.
enum {
    HERALD_EPOLL_READABLE = 1,
    HERALD_EPOLL_WRITABLE = 2,
    /// An error or hang-up on the descriptor (reported only, never requested).
    HERALD_EPOLL_FAILED = 4,
};

/// Adds `fd` to the epoll set (`add` != 0) or changes its interest, level-triggered, to the HERALD_EPOLL_READABLE /
/// HERALD_EPOLL_WRITABLE bits of `interest`. Returns 0 or -1 with errno.
int herald_epoll_watch(int epoll_fd, int fd, unsigned interest, int add);

/// Removes `fd` from the epoll set. Returns 0 or -1 with errno.
int herald_epoll_unwatch(int epoll_fd, int fd);

/// epoll_wait for at most `timeout_ms`, reporting up to `capacity` ready descriptors in `fds` with their HERALD_EPOLL_*
/// bits in `events`. Returns how many were written, 0 on timeout, -1 with errno.
int herald_epoll_wait(int epoll_fd, int *fds, unsigned *events, int capacity, int timeout_ms);

/// The connection's socket (MHD_CONNECTION_INFO_CONNECTION_FD); -1 if unknown.
int herald_mhd_connection_fd(struct MHD_Connection *connection);

/// The client's address (IPv4 or IPv6, without port) written into `buffer`. Returns 0, or -1 when unknown.
int herald_mhd_client_address(struct MHD_Connection *connection, char *buffer, size_t size);
#endif
