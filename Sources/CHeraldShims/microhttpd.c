#include "herald_microhttpd.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

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
    if (options->thread_pool_size > 1) {
        return MHD_start_daemon(
            options->flags | MHD_USE_ERROR_LOG, 0, NULL, NULL,
            options->access_handler, options->access_handler_cls,
            MHD_OPTION_EXTERNAL_LOGGER, herald_mhd_log_trampoline, (void *)options,
            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)options->listen_fd,
            MHD_OPTION_THREAD_POOL_SIZE, options->thread_pool_size,
            MHD_OPTION_CONNECTION_TIMEOUT, options->connection_timeout_seconds,
            MHD_OPTION_CONNECTION_LIMIT, options->connection_limit,
            MHD_OPTION_NOTIFY_COMPLETED, options->request_completed, options->request_completed_cls,
            MHD_OPTION_UNESCAPE_CALLBACK, herald_mhd_unescape_none, NULL,
            MHD_OPTION_END);
    }
    return MHD_start_daemon(
        options->flags | MHD_USE_ERROR_LOG, 0, NULL, NULL,
        options->access_handler, options->access_handler_cls,
        MHD_OPTION_EXTERNAL_LOGGER, herald_mhd_log_trampoline, (void *)options,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)options->listen_fd,
        MHD_OPTION_CONNECTION_TIMEOUT, options->connection_timeout_seconds,
        MHD_OPTION_CONNECTION_LIMIT, options->connection_limit,
        MHD_OPTION_NOTIFY_COMPLETED, options->request_completed, options->request_completed_cls,
        MHD_OPTION_UNESCAPE_CALLBACK, herald_mhd_unescape_none, NULL,
        MHD_OPTION_END);
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
