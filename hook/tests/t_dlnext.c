/* Our dlsym keeps RTLD_NEXT relative to the caller (a tail call), and returns hooks for
 * driver handles only. */
#include "testlib.h"

#include <dlfcn.h>

static const char *where(void *p)
{
    Dl_info i;
    return p && dladdr(p, &i) && i.dli_fname ? i.dli_fname : "?";
}

int main(void)
{
    /* next "dlsym" after the executable is the preloaded library's own */
    void *next = dlsym(RTLD_NEXT, "dlsym");
    EXPECT(strstr(where(next), "libgpushare"), "RTLD_NEXT dlsym from main resolved to %s", where(next));
    void *m = dlsym(RTLD_DEFAULT, "malloc");
    EXPECT(m && !strstr(where(m), "libgpushare"), "malloc resolved to %s", where(m));
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    EXPECT(strstr(where(dlsym(h, "cuMemAlloc_v2")), "libgpushare"), "cuda handle: alloc not hooked");
    EXPECT(strstr(where(dlsym(h, "cuLaunchKernel_ptsz")), "libgpushare"), "cuda handle: launch_ptsz not hooked");
    EXPECT(strstr(where(dlsym(h, "cuDeviceGet")), "sim/libcuda"), "cuda handle: cuDeviceGet hooked");
    EXPECT(dlsym(h, "cuNoSuchThing") == NULL, "unknown symbol found");
    void *hn = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    EXPECT(strstr(where(dlsym(hn, "nvmlDeviceGetMemoryInfo")), "libgpushare"), "nvml: memory info not hooked");
    EXPECT(strstr(where(dlsym(hn, "nvmlInit_v2")), "sim/libnvidia-ml"), "nvml: init hooked");
    return t_done("t_dlnext");
}
