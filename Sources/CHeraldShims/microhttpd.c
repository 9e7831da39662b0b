#include "herald_microhttpd.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

static void herald_mhd_log_trampoline(void *cls, const char *format, va_list arguments) {
    const struct herald_mhd_options *options = cls;
    char message[512];
    vsnprintf(message, sizeof message, format, arguments);
    size_t length = strlen(message);
    while (length > 0 && (message[length - 1] == '\n' || message[length - 1] == '\r')) {
        message[--length] = '\0';
    }
    options->log(options->log_cls, message);
}

static size_t herald_mhd_unescape_none(void *cls, struct MHD_Connection *connection, char *text) {
    (void)cls;
    (void)connection;
    return strlen(text);
}

struct MHD_Daemon *herald_mhd_start(const struct herald_mhd_options *options) {
    // MHD_OPTION_EXTERNAL_LOGGER must come first or early messages go to stderr unformatted.
    return MHD_start_daemon(
        options->flags | MHD_USE_ERROR_LOG, 0, NULL, NULL,
        options->access_handler, options->access_handler_cls,
        MHD_OPTION_EXTERNAL_LOGGER, herald_mhd_log_trampoline, (void *)options,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)options->listen_fd,
        MHD_OPTION_CONNECTION_TIMEOUT, options->connection_timeout_seconds,
        MHD_OPTION_CONNECTION_LIMIT, options->connection_limit,
        MHD_OPTION_NOTIFY_COMPLETED, options->request_completed, options->request_completed_cls,
        MHD_OPTION_UNESCAPE_CALLBACK, herald_mhd_unescape_none, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, options->notify_connection, options->notify_connection_cls,
        MHD_OPTION_END);
}

int herald_mhd_epoll_fd(struct MHD_Daemon *daemon) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_EPOLL_FD);
    return info == NULL ? -1 : info->epoll_fd;
}

int herald_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

int herald_eventfd_create(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

int herald_epoll_add_readable(int epoll_fd, int fd) {
    struct epoll_event event = {.events = EPOLLIN, .data = {.fd = fd}};
    return epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
}

int herald_epoll_watch(int epoll_fd, int fd, unsigned interest, int add) {
    struct epoll_event event = {.events = 0, .data = {.fd = fd}};
    if (interest & HERALD_EPOLL_READABLE) event.events |= EPOLLIN;
    if (interest & HERALD_EPOLL_WRITABLE) event.events |= EPOLLOUT;
    return epoll_ctl(epoll_fd, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &event);
}

int herald_epoll_unwatch(int epoll_fd, int fd) {
    struct epoll_event event = {0};
    return epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, &event);
}

int herald_epoll_wait(int epoll_fd, int *fds, unsigned *events, int capacity, int timeout_ms) {
    struct epoll_event ready[32];
    if (capacity > 32) capacity = 32;
    int count = epoll_wait(epoll_fd, ready, capacity, timeout_ms);
    for (int index = 0; index < count; index++) {
        unsigned bits = 0;
        if (ready[index].events & EPOLLIN) bits |= HERALD_EPOLL_READABLE;
        if (ready[index].events & EPOLLOUT) bits |= HERALD_EPOLL_WRITABLE;
        if (ready[index].events & (EPOLLERR | EPOLLHUP)) bits |= HERALD_EPOLL_FAILED;
        fds[index] = ready[index].data.fd;
        events[index] = bits;
    }
    return count;
}

int herald_mhd_connection_fd(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info == NULL ? -1 : info->connect_fd;
}

int herald_mhd_client_address(struct MHD_Connection *connection, char *buffer, size_t size) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (info == NULL || info->client_addr == NULL) return -1;
    const struct sockaddr *address = info->client_addr;
    const void *raw;
    if (address->sa_family == AF_INET) {
        raw = &((const struct sockaddr_in *)address)->sin_addr;
    } else if (address->sa_family == AF_INET6) {
        raw = &((const struct sockaddr_in6 *)address)->sin6_addr;
    } else {
        return -1;
    }
    return inet_ntop(address->sa_family, raw, buffer, (socklen_t)size) == NULL ? -1 : 0;
}
