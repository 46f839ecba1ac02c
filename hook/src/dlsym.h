#ifndef GPUSHARE_DLSYM_H
#define GPUSHARE_DLSYM_H
typedef void *(*gs_dlsym_fn)(void *, const char *);
/* glibc's dlsym, found without going through ours */
gs_dlsym_fn gs_real_dlsym(void) __attribute__((visibility("hidden")));
/* our hook for (handle, name) if name is hooked and the lookup lands in the driver; else NULL */
void *gs_hooked_symbol(void *handle, const char *name) __attribute__((visibility("hidden")));
#endif
