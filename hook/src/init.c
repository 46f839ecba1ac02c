/* When does the library wake up, and what does it do then? Preloaded into every process of the
 * container, it does nothing at all until the first CUDA or NVML call: no constructor, thread,
 * file or mapping. At that call, once per process: the C library is checked (libc.c), the
 * claim's limits are loaded (limits.c), the fork handlers registered (state.c) and the driver's
 * real functions resolved (symbols.c). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "init.h"
#include "libc.h"
#include "state.h"
#include "symbols.h"

struct gs_limits g_limits;
int g_launch_mode;
int g_cuda_ready, g_nvml_ready;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_nvml_once = PTHREAD_ONCE_INIT;

#ifdef GS_TEST_FAULTS
int g_fault_stop;

/* Only in the test build, build/tests/libgpushare-faults.so; never in the shipped library. */
static void load_test_faults(void)
{
    if (g_limits.mode != GS_MODE_RUN_DIR) return; /* never in a container */
    const char *f = getenv("GPUSHARE_TEST_FAULT");
    g_fault_stop = f && strcmp(f, "stop_in_lock") == 0;
}
#endif

static void init_once(void)
{
    if (!gs_libc_is_glibc()) {
        gs_say_inactive(); /* g_limits stays GS_MODE_NONE: everything passes through */
        return;
    }
    gs_limits_load(&g_limits);
#ifdef GS_TEST_FAULTS
    load_test_faults();
#endif
    pthread_atfork(gs_fork_prepare, gs_fork_parent, gs_fork_child);
}

static void resolve_cuda(void)
{
    gs_resolve(GS_LIB_CUDA, "libcuda.so.1");
    int pace = 0;
    if (g_limits.mode != GS_MODE_NONE && !g_limits.failed)
        for (int i = 0; i < g_limits.count; i++) pace |= g_limits.gpu[i].compute < 100;
    __atomic_store_n(&g_launch_mode, pace ? LAUNCH_PACE : LAUNCH_PASS, __ATOMIC_RELEASE);
    __atomic_store_n(&g_cuda_ready, 1, __ATOMIC_RELEASE);
}

static void resolve_nvml(void)
{
    gs_resolve(GS_LIB_NVML, "libnvidia-ml.so.1");
    __atomic_store_n(&g_nvml_ready, 1, __ATOMIC_RELEASE);
}

void gs_init_cuda(void)
{
    pthread_once(&g_init_once, init_once);
    pthread_once(&g_cuda_once, resolve_cuda);
}

void gs_init_nvml(void)
{
    pthread_once(&g_init_once, init_once);
    pthread_once(&g_nvml_once, resolve_nvml);
}
