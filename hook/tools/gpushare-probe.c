/* gpushare-probe: exercises a CUDA driver the way the CUDA runtime reaches it
 * (dlopen("libcuda.so.1") + cuGetProcAddress), against a real or the simulated driver.
 * Output: plain key=value lines.
 *
 *   gpushare-probe [--device N] alloc --chunk BYTES [--max BYTES] [--hold SECONDS] [--api A]
 *       A = alloc (default) | managed | async | pitch | vmm
 *   gpushare-probe [--device N] meminfo
 *   gpushare-probe [--device N] launch --seconds T [--kernel-us US]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/cuda_abi.h"

/* a busy loop of `cycles` clock ticks: real GPUs need a kernel; the simulator accepts any */
static const char spin_ptx[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry spin(.param .u64 spin_param_0)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [spin_param_0];\n"
    "  mov.u64 %rd2, %clock64;\n"
    "  add.s64 %rd3, %rd2, %rd1;\n"
    "$L_loop:\n"
    "  mov.u64 %rd4, %clock64;\n"
    "  setp.lt.u64 %p1, %rd4, %rd3;\n"
    "  @%p1 bra $L_loop;\n"
    "  ret;\n"
    "}\n";

#define CU_DEVICE_ATTRIBUTE_CLOCK_RATE 13

static __typeof__(&cuGetProcAddress_v2) p_getproc;
#define FN(sym) static __typeof__(&sym) p_##sym
FN(cuInit); FN(cuDeviceGet); FN(cuDeviceGetAttribute); FN(cuDevicePrimaryCtxRetain); FN(cuCtxSetCurrent);
FN(cuCtxSynchronize); FN(cuMemGetInfo_v2); FN(cuDeviceTotalMem_v2); FN(cuMemAlloc_v2); FN(cuMemFree_v2);
FN(cuMemAllocManaged); FN(cuMemAllocAsync); FN(cuMemFreeAsync); FN(cuMemAllocPitch_v2); FN(cuMemCreate);
FN(cuMemRelease); FN(cuModuleLoadData); FN(cuModuleGetFunction); FN(cuLaunchKernel); FN(cuEventCreate);
FN(cuEventRecord); FN(cuEventSynchronize); FN(cuEventElapsedTime); FN(cuGetErrorName);

static void *get(const char *base)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = 0;
    if (p_getproc(base, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || !fn) {
        printf("error=missing_symbol symbol=%s\n", base);
        exit(3);
    }
    return fn;
}

static const char *err_name(CUresult rc)
{
    const char *s = NULL;
    return p_cuGetErrorName && p_cuGetErrorName(rc, &s) == CUDA_SUCCESS && s ? s : "unknown";
}

#define CHECK(call)                                                                  \
    do {                                                                             \
        CUresult rc_ = (call);                                                       \
        if (rc_ != CUDA_SUCCESS) {                                                   \
            printf("error=%s rc=%d call=%s\n", err_name(rc_), rc_, #call);           \
            exit(2);                                                                 \
        }                                                                            \
    } while (0)

static int g_device;

static void load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("error=no_driver detail=%s\n", dlerror());
        exit(2);
    }
    p_getproc = (__typeof__(p_getproc))dlsym(h, "cuGetProcAddress_v2");
    if (!p_getproc) {
        printf("error=no_cuGetProcAddress_v2\n");
        exit(2);
    }
#define GET(sym, base) p_##sym = (__typeof__(p_##sym))get(base)
    GET(cuGetErrorName, "cuGetErrorName");
    GET(cuInit, "cuInit"); GET(cuDeviceGet, "cuDeviceGet"); GET(cuDeviceGetAttribute, "cuDeviceGetAttribute");
    GET(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"); GET(cuCtxSetCurrent, "cuCtxSetCurrent");
    GET(cuCtxSynchronize, "cuCtxSynchronize"); GET(cuMemGetInfo_v2, "cuMemGetInfo");
    GET(cuDeviceTotalMem_v2, "cuDeviceTotalMem"); GET(cuMemAlloc_v2, "cuMemAlloc"); GET(cuMemFree_v2, "cuMemFree");
    GET(cuMemAllocManaged, "cuMemAllocManaged"); GET(cuMemAllocAsync, "cuMemAllocAsync");
    GET(cuMemFreeAsync, "cuMemFreeAsync"); GET(cuMemAllocPitch_v2, "cuMemAllocPitch");
    GET(cuMemCreate, "cuMemCreate"); GET(cuMemRelease, "cuMemRelease");
    GET(cuModuleLoadData, "cuModuleLoadData"); GET(cuModuleGetFunction, "cuModuleGetFunction");
    GET(cuLaunchKernel, "cuLaunchKernel"); GET(cuEventCreate, "cuEventCreate");
    GET(cuEventRecord, "cuEventRecord"); GET(cuEventSynchronize, "cuEventSynchronize");
    GET(cuEventElapsedTime, "cuEventElapsedTime");
    CUdevice dev;
    CUcontext ctx;
    CHECK(p_cuInit(0));
    CHECK(p_cuDeviceGet(&dev, g_device));
    CHECK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(p_cuCtxSetCurrent(ctx));
}

static unsigned long long parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (!strcmp(end, "Ki")) v <<= 10;
    else if (!strcmp(end, "Mi")) v <<= 20;
    else if (!strcmp(end, "Gi")) v <<= 30;
    else if (*end) {
        fprintf(stderr, "bad size %s\n", s);
        exit(64);
    }
    return v;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* one allocation of `size` by the chosen API; key identifies it for free_one */
static CUresult alloc_one(const char *api, size_t size, unsigned long long *key)
{
    if (!strcmp(api, "managed")) return p_cuMemAllocManaged(key, size, CU_MEM_ATTACH_GLOBAL);
    if (!strcmp(api, "async")) return p_cuMemAllocAsync(key, size, NULL);
    if (!strcmp(api, "pitch")) {
        size_t pitch;
        return p_cuMemAllocPitch_v2(key, &pitch, size / 64, 64, 4);
    }
    if (!strcmp(api, "vmm")) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = g_device;
        return p_cuMemCreate(key, size, &prop, 0);
    }
    return p_cuMemAlloc_v2(key, size);
}

static CUresult free_one(const char *api, unsigned long long key)
{
    if (!strcmp(api, "vmm")) return p_cuMemRelease(key);
    if (!strcmp(api, "async")) return p_cuMemFreeAsync(key, NULL);
    return p_cuMemFree_v2(key);
}

static int cmd_alloc(int argc, char **argv)
{
    unsigned long long chunk = 0, max = ~0ull;
    double hold = 0;
    const char *api = "alloc";
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--chunk")) chunk = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "--max")) max = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "--hold")) hold = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--api")) api = argv[i + 1];
    }
    if (!chunk) {
        fprintf(stderr, "alloc needs --chunk BYTES\n");
        return 64;
    }
    load_driver();
    static unsigned long long keys[1 << 16];
    int n = 0;
    unsigned long long total = 0;
    const char *result = "max";
    while (total + chunk <= max && n < (int)(sizeof keys / sizeof keys[0])) {
        CUresult rc = alloc_one(api, chunk, &keys[n]);
        printf("step=%d rc=%d name=%s allocated=%llu\n", n, rc, err_name(rc), total + (rc ? 0 : chunk));
        if (rc != CUDA_SUCCESS) {
            result = rc == CUDA_ERROR_OUT_OF_MEMORY ? "oom" : "error";
            break;
        }
        total += chunk;
        n++;
    }
    printf("allocated=%llu chunks=%d result=%s\n", total, n, result);
    fflush(stdout);
    if (hold > 0) usleep((useconds_t)(hold * 1e6));
    int bad = 0;
    for (int i = 0; i < n; i++) bad += free_one(api, keys[i]) != CUDA_SUCCESS;
    printf("freed=%d free_errors=%d\n", n, bad);
    return 0;
}

static int cmd_meminfo(void)
{
    load_driver();
    size_t fr = 0, tot = 0, dtot = 0;
    CUresult rc = p_cuMemGetInfo_v2(&fr, &tot);
    printf("cu_rc=%d cu_free=%zu cu_total=%zu\n", rc, fr, tot);
    rc = p_cuDeviceTotalMem_v2(&dtot, g_device);
    printf("device_total=%zu\n", dtot);
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("nvml=unavailable\n");
        return 0;
    }
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(h, "nvmlInit_v2");
    __typeof__(&nvmlDeviceGetHandleByIndex_v2) by_index = (__typeof__(by_index))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    __typeof__(&nvmlDeviceGetMemoryInfo) mem = (__typeof__(mem))dlsym(h, "nvmlDeviceGetMemoryInfo");
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) mem2 = (__typeof__(mem2))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    nvmlDevice_t d;
    if (!init || !by_index || !mem || init() != NVML_SUCCESS || by_index((unsigned)g_device, &d) != NVML_SUCCESS) {
        printf("nvml=error\n");
        return 0;
    }
    nvmlMemory_t m;
    if (mem(d, &m) == NVML_SUCCESS) printf("nvml_total=%llu nvml_free=%llu nvml_used=%llu\n", m.total, m.free, m.used);
    nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
    if (mem2 && mem2(d, &m2) == NVML_SUCCESS)
        printf("nvml2_total=%llu nvml2_free=%llu nvml2_used=%llu\n", m2.total, m2.free, m2.used);
    return 0;
}

static int cmd_launch(int argc, char **argv)
{
    double seconds = 1, kernel_us = 100;
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--kernel-us")) kernel_us = atof(argv[i + 1]);
    }
    load_driver();
    int khz = 0;
    CHECK(p_cuDeviceGetAttribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, g_device));
    unsigned long long cycles = (unsigned long long)(kernel_us * (khz > 0 ? khz : 1000000) / 1000.0);
    CUmodule mod;
    CUfunction fn;
    CHECK(p_cuModuleLoadData(&mod, spin_ptx));
    CHECK(p_cuModuleGetFunction(&fn, mod, "spin"));
    void *params[] = {&cycles};
    CUevent e0, e1;
    CHECK(p_cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CHECK(p_cuEventCreate(&e1, CU_EVENT_DEFAULT));
    /* calibrate: GPU time of one kernel, the shortest of a few */
    float best = 1e9f;
    for (int i = 0; i < 5; i++) {
        float ms;
        CHECK(p_cuEventRecord(e0, NULL));
        CHECK(p_cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        CHECK(p_cuEventRecord(e1, NULL));
        CHECK(p_cuEventSynchronize(e1));
        CHECK(p_cuEventElapsedTime(&ms, e0, e1));
        if (ms < best) best = ms;
    }
    long long launches = 0;
    double t0 = now_s(), end = t0 + seconds;
    while (now_s() < end) {
        for (int i = 0; i < 16; i++) CHECK(p_cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        launches += 16;
    }
    CHECK(p_cuCtxSynchronize());
    double wall = now_s() - t0;
    printf("launches=%lld seconds=%.3f launches_per_s=%.1f kernel_us=%.1f busy_share=%.2f\n", launches, wall,
           launches / wall, best * 1000.0, 100.0 * launches * best / 1000.0 / wall);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int i = 1;
    if (i + 1 < argc && !strcmp(argv[i], "--device")) {
        g_device = atoi(argv[i + 1]);
        i += 2;
    }
    if (i < argc && !strcmp(argv[i], "alloc")) return cmd_alloc(argc - i - 1, argv + i + 1);
    if (i < argc && !strcmp(argv[i], "meminfo")) return cmd_meminfo();
    if (i < argc && !strcmp(argv[i], "launch")) return cmd_launch(argc - i - 1, argv + i + 1);
    fprintf(stderr, "usage: gpushare-probe [--device N] alloc --chunk BYTES [--max BYTES] [--hold S] [--api A]\n"
                    "       gpushare-probe [--device N] meminfo\n"
                    "       gpushare-probe [--device N] launch --seconds T [--kernel-us US]\n");
    return 64;
}
