#define _GNU_SOURCE
#include "herald_thread.h"

#include <pthread.h>
#include <string.h>

int herald_thread_set_name(const char *name) {
    char cut[16];
    strncpy(cut, name, sizeof cut - 1);
    cut[sizeof cut - 1] = '\0';
    return pthread_setname_np(pthread_self(), cut);
}
