#ifndef GPUSHARE_DLSYM_H
#define GPUSHARE_DLSYM_H
typedef void *(*gs_dlsym_fn)(void *, const char *);
/* glibc's dlsym, found without going through ours */
gs_dlsym_fn gs_real_dlsym(void) __attribute__((visibility("hidden")));
/* 1 under glibc; 0 under another C library (musl), where the library stays out of the way */
int gs_libc_is_glibc(void) __attribute__((visibility("hidden")));
/* our hook for (handle, name) if name is hooked and the lookup lands in the driver; else NULL */
void *gs_hooked_symbol(void *handle, const char *name) __attribute__((visibility("hidden")));
#endif
