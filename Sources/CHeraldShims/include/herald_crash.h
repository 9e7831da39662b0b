#ifndef HERALD_SHIMS_CRASH_H
#define HERALD_SHIMS_CRASH_H
// A fatal-signal handler that writes one JSON log line before the process dies, using only async-signal-safe
// calls. Swift cannot write a signal handler that is safe to run at any instant, so this one is C.

/// Called first on a fatal signal, to write out what a log buffer holds (best effort: it must not block).
typedef void (*herald_crash_flush_fn)(void);

/// Installs the handler for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT on an alternate stack. `logger` names
/// the process in the line (copied). A handler installed earlier (a sanitizer's, the Swift runtime's backtracer)
/// still gets a fault the kernel raised, afterwards; a signal sent by another process kills the process at once.
/// Returns 0, or -1 when a signal could not be handled.
int herald_crash_handler_install(const char *logger, herald_crash_flush_fn flush);
#endif
