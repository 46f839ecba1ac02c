/* Helpers for the hook's C test programs (run against the simulated driver). */
#ifndef GPUSHARE_TESTLIB_H
#define GPUSHARE_TESTLIB_H
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cuda_abi.h"

static int t_failures;

#define EXPECT(cond, ...)                                                  \
    do {                                                                   \
        if (!(cond)) {                                                     \
            t_failures++;                                                  \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
            printf(__VA_ARGS__);                                           \
            printf("\n");                                                  \
        }                                                                  \
    } while (0)
#define EXPECT_RC(call, want)                                              \
    do {                                                                   \
        CUresult rc_ = (call);                                             \
        EXPECT(rc_ == (want), "%s returned %d, want %d", #call, rc_, (int)(want)); \
    } while (0)

__attribute__((unused)) static void t_setup(int device)
{
    CUdevice d;
    CUcontext c;
    if (cuInit(0) || cuDeviceGet(&d, device) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) {
        printf("FAIL: cannot set up the simulated device\n");
        exit(1);
    }
}

/* the claim's usage as this process sees it: reported total minus reported free */
__attribute__((unused)) static unsigned long long t_used(void)
{
    size_t fr = 0, tot = 0;
    if (cuMemGetInfo_v2(&fr, &tot) != CUDA_SUCCESS) return ~0ull;
    return tot - fr;
}

__attribute__((unused)) static unsigned long long t_total(void)
{
    size_t fr = 0, tot = 0;
    cuMemGetInfo_v2(&fr, &tot);
    return tot;
}

__attribute__((unused)) static int t_done(const char *name)
{
    printf("%s %s failures=%d\n", t_failures ? "FAILED" : "OK", name, t_failures);
    return t_failures ? 1 : 0;
}

#endif
