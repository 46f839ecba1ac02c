/* When does the library wake up? At the first CUDA or NVML call, never before (init.c):
 * every hook calls ensure_cuda() or ensure_nvml() first. */
#ifndef GPUSHARE_INIT_H
#define GPUSHARE_INIT_H

#include "compiler.h"
#include "limits.h"

extern struct gs_limits g_limits GS_HIDDEN; /* loaded at the first driver call */

enum { LAUNCH_UNREADY = 0, LAUNCH_PASS, LAUNCH_PACE };
extern int g_launch_mode GS_HIDDEN; /* the single branch a launch takes when nothing is paced */

extern int g_cuda_ready GS_HIDDEN, g_nvml_ready GS_HIDDEN;
void gs_init_cuda(void) GS_HIDDEN;
void gs_init_nvml(void) GS_HIDDEN;

#ifdef GS_TEST_FAULTS /* test builds only (hook/README.md, "Test-only fault hook") */
extern int g_fault_stop GS_HIDDEN;
#endif

/* limits loaded, fork handlers registered, libcuda's real functions resolved */
static inline void ensure_cuda(void)
{
    if (LIKELY(__atomic_load_n(&g_cuda_ready, __ATOMIC_ACQUIRE))) return;
    gs_init_cuda();
}

/* the same for libnvidia-ml */
static inline void ensure_nvml(void)
{
    if (LIKELY(__atomic_load_n(&g_nvml_ready, __ATOMIC_ACQUIRE))) return;
    gs_init_nvml();
}

#endif
