/* Micro-benchmarks of the hook's added cost, run against the simulated driver (linked
 * directly, so the same binary runs with and without LD_PRELOAD). hack/bench-hook drives it.
 *   bench-hook launch N       ns per cuLaunchKernel (use GPUSHARE_SIM_KERNEL_US=0)
 *   bench-hook alloc N SIZE   ns per cuMemAlloc_v2 + cuMemFree_v2 pair
 *   bench-hook first-alloc    cuInit, context, one allocation, exit */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/cuda_abi.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void setup(void)
{
    CUdevice d;
    CUcontext c;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) {
        fprintf(stderr, "bench: no device\n");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) return 64;
    setup();
    if (!strcmp(argv[1], "first-alloc")) {
        CUdeviceptr p;
        return cuMemAlloc_v2(&p, 1 << 20) == CUDA_SUCCESS ? 0 : 1;
    }
    long n = argc > 2 ? atol(argv[2]) : 1000000;
    if (!strcmp(argv[1], "launch")) {
        CUfunction f = (CUfunction)(uintptr_t)0x1000;
        for (int i = 0; i < 1000; i++) cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL); /* warm */
        double t0 = now_ns();
        for (long i = 0; i < n; i++)
            if (cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) return 1;
        printf("ns_per_call=%.2f\n", (now_ns() - t0) / n);
        return 0;
    }
    if (!strcmp(argv[1], "alloc")) {
        size_t size = argc > 3 ? strtoull(argv[3], NULL, 10) : 4096;
        CUdeviceptr p;
        for (int i = 0; i < 1000; i++) cuMemAlloc_v2(&p, size), cuMemFree_v2(p); /* warm */
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            if (cuMemAlloc_v2(&p, size) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS) return 1;
        }
        printf("ns_per_pair=%.2f\n", (now_ns() - t0) / n);
        return 0;
    }
    return 64;
}
