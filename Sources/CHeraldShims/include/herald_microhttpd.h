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
    /// Worker threads; 0 or 1 means the single internal polling thread.
    unsigned int thread_pool_size;
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
};

/// MHD_start_daemon with the options above. The request path and query arguments are left percent-encoded
/// (an identity unescape callback) so that the router can split the path before decoding its segments.
struct MHD_Daemon *herald_mhd_start(const struct herald_mhd_options *options);

/// The client's address (IPv4 or IPv6, without port) written into `buffer`. Returns 0, or -1 when unknown.
int herald_mhd_client_address(struct MHD_Connection *connection, char *buffer, size_t size);
#endif
