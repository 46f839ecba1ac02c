/* Our dlsym: applications that dlopen the driver and look its functions up (the CUDA
 * runtime, PyTorch, pynvml) get our hooks. Kept in its own file, built without
 * AddressSanitizer even in the ASan variant: sanitizer start-up calls dlsym before shadow
 * memory exists, and ASan instrumentation would prevent the tail call below. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "dlsym.h"

static gs_dlsym_fn real_dlsym_p;

gs_dlsym_fn gs_real_dlsym(void)
{
    gs_dlsym_fn f = __atomic_load_n(&real_dlsym_p, __ATOMIC_ACQUIRE);
    if (__builtin_expect(!f, 0)) {
        /* glibc >= 2.34 exports dlsym from libc; older ones from libdl */
        f = (gs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!f) f = (gs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        __atomic_store_n(&real_dlsym_p, f, __ATOMIC_RELEASE);
    }
    return f;
}

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name)
{
    /* every process calls this: two character compares unless the name is cu* or nv* */
    if ((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v')) {
        void *h = gs_hooked_symbol(handle, name);
        if (h) return h;
    }
    /* a tail call (checked by the tests), so RTLD_NEXT still means "after the caller" */
    return gs_real_dlsym()(handle, name);
}
