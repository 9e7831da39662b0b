#define _GNU_SOURCE
#include "herald_crash.h"

#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
#define FATAL_COUNT (sizeof fatal_signals / sizeof fatal_signals[0])
static struct sigaction previous[FATAL_COUNT];
static char logger_name[64];
static herald_crash_flush_fn flush_log;
static volatile sig_atomic_t crashing;

// A line built in a fixed buffer: no allocation, no stdio.
struct line { char text[4096]; size_t length; };

static void put(struct line *line, const char *text) {
    size_t n = strlen(text);
    if (n > sizeof line->text - 2 - line->length) n = sizeof line->text - 2 - line->length;
    memcpy(line->text + line->length, text, n);
    line->length += n;
}

// Only characters that need no JSON escaping (thread names are copied through this).
static void put_plain(struct line *line, const char *text) {
    char safe[64];
    size_t i = 0;
    for (; text[i] && i < sizeof safe - 1; i++) {
        unsigned char c = (unsigned char)text[i];
        safe[i] = (c < 0x20 || c == '"' || c == '\\' || c >= 0x7f) ? '?' : (char)c;
    }
    safe[i] = 0;
    put(line, safe);
}

static void put_unsigned(struct line *line, uint64_t value, int base, int width) {
    char digits[24];
    int n = 0;
    do { digits[n++] = "0123456789abcdef"[value % base]; value /= base; } while (value && n < 23);
    while (n < width) digits[n++] = '0';
    char out[24];
    for (int i = 0; i < n; i++) out[i] = digits[n - 1 - i];
    out[n] = 0;
    put(line, out);
}

// RFC 3339 UTC with milliseconds, as the logger writes, from days since the epoch (Howard Hinnant's algorithm).
static void put_timestamp(struct line *line) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t seconds = now.tv_sec, days = seconds / 86400, rest = seconds % 86400;
    days += 719468;
    int64_t era = days / 146097, doe = days - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    int64_t day = doy - (153 * mp + 2) / 5 + 1, month = mp < 10 ? mp + 3 : mp - 9, year = yoe + era * 400 + (month <= 2);
    put_unsigned(line, (uint64_t)year, 10, 4); put(line, "-");
    put_unsigned(line, (uint64_t)month, 10, 2); put(line, "-");
    put_unsigned(line, (uint64_t)day, 10, 2); put(line, "T");
    put_unsigned(line, (uint64_t)(rest / 3600), 10, 2); put(line, ":");
    put_unsigned(line, (uint64_t)(rest % 3600 / 60), 10, 2); put(line, ":");
    put_unsigned(line, (uint64_t)(rest % 60), 10, 2); put(line, ".");
    put_unsigned(line, (uint64_t)(now.tv_nsec / 1000000), 10, 3); put(line, "Z");
}

static const char *signal_name(int number) {
    switch (number) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "unknown";
    }
}

static void on_fatal_signal(int number, siginfo_t *info, void *context) {
    (void)context;
    size_t index = 0;
    while (index < FATAL_COUNT && fatal_signals[index] != number) index++;
    if (!crashing) {
        crashing = 1;
        if (flush_log) flush_log();
        struct line line = {.length = 0};
        char thread[17] = {0};
        prctl(PR_GET_NAME, thread, 0, 0, 0);
        put(&line, "{\"ts\":\""); put_timestamp(&line);
        put(&line, "\",\"level\":\"error\",\"logger\":\""); put(&line, logger_name);
        put(&line, "\",\"msg\":\"fatal signal: the process dies\",\"signal\":\""); put(&line, signal_name(number));
        put(&line, "\",\"signal.code\":\""); put_unsigned(&line, (uint64_t)(int64_t)info->si_code, 10, 1);
        put(&line, "\",\"signal.sent_by\":\""); put(&line, info->si_code > 0 ? "kernel" : "process");
        put(&line, "\",\"fault.address\":\"0x"); put_unsigned(&line, (uint64_t)(uintptr_t)info->si_addr, 16, 1);
        put(&line, "\",\"thread\":\""); put_plain(&line, thread);
        put(&line, "\",\"pid\":\""); put_unsigned(&line, (uint64_t)getpid(), 10, 1);
        void *frames[32];
        int count = backtrace(frames, 32);
        put(&line, "\",\"backtrace\":\"");
        for (int i = 0; i < count; i++) {
            if (i) put(&line, " ");
            put(&line, "0x"); put_unsigned(&line, (uint64_t)(uintptr_t)frames[i], 16, 1);
        }
        put(&line, "\"}\n");
        ssize_t ignored = write(2, line.text, line.length);
        (void)ignored;
    }
    // A fault the kernel raised goes to whoever had the signal before (a sanitizer, the Swift runtime's
    // backtracer, or the default: die), when the instruction runs again. A signal another process sent kills
    // the process as it would have without handlers (the backtracer would report it and carry on).
    if (info->si_code > 0 && index < FATAL_COUNT) {
        sigaction(number, &previous[index], NULL);
    } else {
        signal(number, SIG_DFL);
        raise(number);
    }
}

int herald_crash_handler_install(const char *logger, herald_crash_flush_fn flush) {
    strncpy(logger_name, logger, sizeof logger_name - 1);
    for (char *c = logger_name; *c; c++) if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '?';
    flush_log = flush;
    // backtrace() loads libgcc on first use, which allocates: do that now, not in the handler.
    void *warm[2];
    backtrace(warm, 2);
    static char alternate_stack[64 * 1024];
    stack_t stack = {.ss_sp = alternate_stack, .ss_size = sizeof alternate_stack, .ss_flags = 0};
    sigaltstack(&stack, NULL);
    int result = 0;
    for (size_t i = 0; i < FATAL_COUNT; i++) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = on_fatal_signal;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        if (sigaction(fatal_signals[i], &action, &previous[i]) != 0) result = -1;
    }
    return result;
}
