#ifndef HERALD_SHIMS_MALLOC_H
#define HERALD_SHIMS_MALLOC_H
// glibc's malloc_trim, which Swift's Glibc module does not export.
#include <malloc.h>

/// Returns the free memory of every malloc arena to the system; 1 if some was released.
static inline int herald_malloc_trim(void) { return malloc_trim(0); }
#endif
