/* Which C library is this process running, and where is its own dlsym? (libc.c; built
 * without AddressSanitizer, like dlsym.c: both run inside sanitizer start-up.) */
#ifndef GPUSHARE_LIBC_H
#define GPUSHARE_LIBC_H

#include "compiler.h"

typedef void *(*gs_dlsym_fn)(void *, const char *);

extern gs_dlsym_fn gs_real_dlsym_p GS_HIDDEN; /* NULL until first needed */
gs_dlsym_fn gs_find_real_dlsym(void) GS_HIDDEN;

/* the C library's dlsym, found without going through ours (inline: our dlsym's fast path) */
static inline gs_dlsym_fn gs_real_dlsym(void)
{
    gs_dlsym_fn f = __atomic_load_n(&gs_real_dlsym_p, __ATOMIC_ACQUIRE);
    return __builtin_expect(!f, 0) ? gs_find_real_dlsym() : f;
}

/* 1 under glibc; 0 under another C library (musl), where the library stays out of the way */
int gs_libc_is_glibc(void) GS_HIDDEN;
/* under another C library: say once per process that the library is inactive */
void gs_say_inactive(void) GS_HIDDEN;

#endif
