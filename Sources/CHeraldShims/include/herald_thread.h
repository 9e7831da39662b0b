#ifndef HERALD_SHIMS_THREAD_H
#define HERALD_SHIMS_THREAD_H
/// Names the calling thread for the kernel (`/proc/<pid>/task/*/comm`, `top -H`, `perf`); Linux keeps the first 15
/// bytes. Returns 0, or an errno value.
int herald_thread_set_name(const char *name);
#endif
