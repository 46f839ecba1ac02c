/* Our dlsym: how applications that dlopen the driver and look its functions up (the CUDA
 * runtime, PyTorch, pynvml) get our hooks. Built without AddressSanitizer even in the ASan
 * variant (hook/Makefile, NOSAN_SRC): sanitizer start-up calls dlsym before shadow memory
 * exists, and ASan instrumentation would prevent the tail call below. Which names are hooked:
 * symbols.c; the C library's own dlsym: libc.c. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "libc.h"
#include "symbols.h"

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
