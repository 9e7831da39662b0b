#define _GNU_SOURCE
#include "herald_http.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

int herald_http_accept(int listen_fd, char *address, size_t address_size) {
    struct sockaddr_storage peer;
    socklen_t length = sizeof peer;
    int fd = accept4(listen_fd, (struct sockaddr *)&peer, &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (address_size > 0) address[0] = '\0';
    const void *raw = NULL;
    if (peer.ss_family == AF_INET) raw = &((const struct sockaddr_in *)&peer)->sin_addr;
    if (peer.ss_family == AF_INET6) raw = &((const struct sockaddr_in6 *)&peer)->sin6_addr;
    if (raw != NULL && inet_ntop(peer.ss_family, raw, address, (socklen_t)address_size) == NULL && address_size > 0) {
        address[0] = '\0';
    }
    return fd;
}

long herald_http_date(char *buffer, size_t size) {
    time_t now = time(NULL);
    struct tm parts;
    gmtime_r(&now, &parts);
    strftime(buffer, size, "%a, %d %b %Y %H:%M:%S GMT", &parts);
    return (long)now;
}
