#define _GNU_SOURCE
#include "herald_epoll.h"
#include <sys/epoll.h>
#include <sys/eventfd.h>

int herald_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

int herald_eventfd_create(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

int herald_epoll_add_readable(int epoll_fd, int fd) {
    struct epoll_event event = {.events = EPOLLIN, .data = {.fd = fd}};
    return epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
}

int herald_epoll_add_listener(int epoll_fd, int fd) {
    struct epoll_event event = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data = {.fd = fd}};
    return epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
}

int herald_epoll_add_connection(int epoll_fd, int fd) {
    struct epoll_event event = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data = {.fd = fd}};
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
    struct epoll_event ready[64];
    if (capacity > 64) capacity = 64;
    int count = epoll_wait(epoll_fd, ready, capacity, timeout_ms);
    for (int index = 0; index < count; index++) {
        unsigned bits = 0;
        if (ready[index].events & (EPOLLIN | EPOLLRDHUP)) bits |= HERALD_EPOLL_READABLE;
        if (ready[index].events & EPOLLOUT) bits |= HERALD_EPOLL_WRITABLE;
        if (ready[index].events & (EPOLLERR | EPOLLHUP)) bits |= HERALD_EPOLL_FAILED;
        if (ready[index].events & EPOLLRDHUP) bits |= HERALD_EPOLL_PEER_CLOSED;
        fds[index] = ready[index].data.fd;
        events[index] = bits;
    }
    return count;
}
