/* Every allocation API is counted and freed; OOM exactly at the limit; odd sizes; lookups
 * through dlsym and cuGetProcAddress land on the hooks.
 * usage: t_apis LIMIT            (limits file: one GPU, memory LIMIT)
 *        t_apis LIMIT physfail   (simulated device smaller than LIMIT) */
#include "testlib.h"

#include <dlfcn.h>
#include <stdint.h>

static unsigned long long L;

static void basic(void)
{
    CUdeviceptr a, b;
    EXPECT(t_total() == L, "total %llu != limit %llu", t_total(), L);
    EXPECT_RC(cuMemAlloc_v2(&a, L), CUDA_SUCCESS);
    EXPECT(t_used() == L, "used %llu", t_used());
    EXPECT_RC(cuMemAlloc_v2(&b, 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(t_used() == L, "a refused allocation changed usage: %llu", t_used());
    EXPECT_RC(cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT(t_used() == 0, "used after free %llu", t_used());
    /* exactly at the limit, in two pieces */
    EXPECT_RC(cuMemAlloc_v2(&a, L - 4096), CUDA_SUCCESS);
    EXPECT_RC(cuMemAlloc_v2(&b, 4097), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemAlloc_v2(&b, 4096), CUDA_SUCCESS);
    EXPECT_RC(cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_RC(cuMemFree_v2(b), CUDA_SUCCESS);
    EXPECT(t_used() == 0, "used %llu", t_used());
}

static void odd_sizes(void)
{
    CUdeviceptr a;
    EXPECT_RC(cuMemAlloc_v2(&a, 0), CUDA_ERROR_INVALID_VALUE); /* the driver's answer */
    EXPECT_RC(cuMemAlloc_v2(&a, SIZE_MAX), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemAlloc_v2(&a, SIZE_MAX - 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemAlloc_v2(&a, L + 1), CUDA_ERROR_OUT_OF_MEMORY);
    size_t pitch;
    EXPECT_RC(cuMemAllocPitch_v2(&a, &pitch, SIZE_MAX, 2, 4), CUDA_ERROR_OUT_OF_MEMORY);
    CUDA_ARRAY_DESCRIPTOR huge = {SIZE_MAX / 2, 4, 0x20, 4};
    CUarray arr;
    EXPECT_RC(cuArrayCreate_v2(&arr, &huge), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(t_used() == 0, "used %llu", t_used());
    /* unknown pointers pass through untouched */
    EXPECT_RC(cuMemFree_v2(0xdead0000), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemAlloc_v2(&a, 1000), CUDA_SUCCESS);
    EXPECT_RC(cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_RC(cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE); /* double free */
    EXPECT(t_used() == 0, "used %llu", t_used());
}

static void each_api(void)
{
    CUdeviceptr p;
    size_t pitch = 0;
    EXPECT_RC(cuMemAllocPitch_v2(&p, &pitch, 1000, 100, 4), CUDA_SUCCESS);
    EXPECT(pitch == 1024 && t_used() == 1024 * 100, "pitch %zu used %llu", pitch, t_used());
    EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS);

    EXPECT_RC(cuMemAllocManaged(&p, 5000, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    EXPECT(t_used() == 5000, "managed used %llu", t_used());
    EXPECT_RC(cuMemAllocManaged(&p, L, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS);

    CUdeviceptr q, r, s;
    EXPECT_RC(cuMemAllocAsync(&p, 1 << 20, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuMemAllocAsync_ptsz(&q, 1 << 20, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuMemAllocFromPoolAsync(&r, 1 << 20, NULL, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuMemAllocFromPoolAsync_ptsz(&s, 1 << 20, NULL, NULL), CUDA_SUCCESS);
    EXPECT(t_used() == 4 << 20, "async used %llu", t_used());
    EXPECT_RC(cuMemFreeAsync(p, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuMemFreeAsync_ptsz(q, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuMemFree_v2(r), CUDA_SUCCESS); /* stream-ordered memory freed synchronously */
    EXPECT_RC(cuMemFreeAsync(s, NULL), CUDA_SUCCESS);
    EXPECT(t_used() == 0, "async used after free %llu", t_used());

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h1, h2;
    EXPECT_RC(cuMemCreate(&h1, 2 << 20, &prop, 0), CUDA_SUCCESS);
    EXPECT(t_used() == 2 << 20, "vmm used %llu", t_used());
    EXPECT_RC(cuMemCreate(&h2, L, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST; /* host memory is not the GPU's */
    EXPECT_RC(cuMemCreate(&h2, L, &prop, 0), CUDA_SUCCESS);
    EXPECT(t_used() == 2 << 20, "host vmm counted: %llu", t_used());
    EXPECT_RC(cuMemRelease(h2), CUDA_SUCCESS);
    EXPECT_RC(cuMemRelease(h1), CUDA_SUCCESS);
    EXPECT(t_used() == 0, "vmm used after release %llu", t_used());

    CUarray a2, a3;
    CUDA_ARRAY_DESCRIPTOR d2 = {256, 256, 0x20 /* float */, 4};
    EXPECT_RC(cuArrayCreate_v2(&a2, &d2), CUDA_SUCCESS);
    EXPECT(t_used() == 256 * 256 * 16, "array used %llu", t_used());
    CUDA_ARRAY3D_DESCRIPTOR d3 = {64, 64, 8, 0x01 /* u8 */, 2, 0};
    EXPECT_RC(cuArray3DCreate_v2(&a3, &d3), CUDA_SUCCESS);
    EXPECT(t_used() == 256 * 256 * 16 + 64 * 64 * 8 * 2, "array3d used %llu", t_used());
    EXPECT_RC(cuArrayDestroy(a2), CUDA_SUCCESS);
    EXPECT_RC(cuArrayDestroy(a3), CUDA_SUCCESS);
    CUmipmappedArray m;
    CUDA_ARRAY3D_DESCRIPTOR dm = {64, 64, 0, 0x20, 1, 0};
    EXPECT_RC(cuMipmappedArrayCreate(&m, &dm, 3), CUDA_SUCCESS);
    EXPECT(t_used() == 4 * (64 * 64 + 32 * 32 + 16 * 16), "mipmap used %llu", t_used());
    EXPECT_RC(cuMipmappedArrayDestroy(m), CUDA_SUCCESS);
    EXPECT(t_used() == 0, "arrays used after destroy %llu", t_used());
}

static void lookups(void)
{
    /* dlopen + dlsym, as the CUDA runtime and PyTorch do */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    __typeof__(&cuMemAlloc_v2) alloc = (__typeof__(alloc))dlsym(h, "cuMemAlloc_v2");
    __typeof__(&cuMemFree_v2) mfree = (__typeof__(mfree))dlsym(h, "cuMemFree_v2");
    Dl_info info;
    EXPECT(alloc && dladdr((void *)alloc, &info) && strstr(info.dli_fname, "libgpushare"),
           "dlsym(libcuda, cuMemAlloc_v2) is not the hook");
    CUdeviceptr p;
    EXPECT_RC(alloc(&p, 777), CUDA_SUCCESS);
    EXPECT(t_used() == 777, "dlsym path used %llu", t_used());
    EXPECT_RC(mfree(p), CUDA_SUCCESS);
    void *init = dlsym(h, "cuInit");
    EXPECT(init && dladdr(init, &info) && strstr(info.dli_fname, "sim/libcuda"), "cuInit should be the driver's");

    /* cuGetProcAddress(_v2) by base name, CUDA version and per-thread flag */
    __typeof__(&cuGetProcAddress_v2) gpa = (__typeof__(gpa))dlsym(h, "cuGetProcAddress_v2");
    void *fn = NULL;
    EXPECT_RC(gpa("cuMemAlloc", &fn, 12000, 0, NULL), CUDA_SUCCESS);
    EXPECT(fn == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2") && dladdr(fn, &info) && strstr(info.dli_fname, "libgpushare"),
           "cuGetProcAddress(cuMemAlloc) is not the hook");
    EXPECT_RC(gpa("cuLaunchKernel", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL), CUDA_SUCCESS);
    EXPECT(fn == (void *)cuLaunchKernel_ptsz, "per-thread cuLaunchKernel is not the _ptsz hook");
    EXPECT_RC(gpa("cuMemAllocAsync", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL), CUDA_SUCCESS);
    EXPECT(fn == (void *)cuMemAllocAsync_ptsz, "per-thread cuMemAllocAsync is not the _ptsz hook");
    EXPECT_RC(((__typeof__(&cuMemAllocAsync_ptsz))fn)(&p, 4242, NULL), CUDA_SUCCESS);
    EXPECT(t_used() == 4242, "ptsz path used %llu", t_used());
    EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS);
    EXPECT_RC(gpa("cuGetProcAddress", &fn, 12000, 0, NULL), CUDA_SUCCESS);
    EXPECT(fn == (void *)cuGetProcAddress_v2, "cuGetProcAddress via itself is not the hook");
    EXPECT_RC(gpa("cuMemGetInfo", &fn, 12000, 0, NULL), CUDA_SUCCESS);
    EXPECT(fn == (void *)cuMemGetInfo_v2, "cuMemGetInfo is not the hook");
    EXPECT_RC(gpa("cuCtxGetDevice", &fn, 12000, 0, NULL), CUDA_SUCCESS);
    EXPECT(fn && dladdr(fn, &info) && strstr(info.dli_fname, "sim/libcuda"), "unhooked symbol changed");
    __typeof__(&cuGetProcAddress) gpa1 = (__typeof__(gpa1))dlsym(h, "cuGetProcAddress");
    EXPECT_RC(gpa1("cuMemFree", &fn, 12000, 0), CUDA_SUCCESS);
    EXPECT(fn == (void *)cuMemFree_v2, "cuGetProcAddress v1: cuMemFree is not the hook");

    /* NVML, linked and through dlsym */
    nvmlDevice_t d;
    nvmlMemory_t m;
    EXPECT(nvmlInit_v2() == NVML_SUCCESS && nvmlDeviceGetHandleByIndex_v2(0, &d) == NVML_SUCCESS, "nvml init");
    EXPECT(nvmlDeviceGetMemoryInfo(d, &m) == NVML_SUCCESS && m.total == L && m.free == L, "nvml total %llu", m.total);
    void *hn = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) m2fn = (__typeof__(m2fn))dlsym(hn, "nvmlDeviceGetMemoryInfo_v2");
    nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
    EXPECT_RC(cuMemAlloc_v2(&p, 1 << 20), CUDA_SUCCESS);
    EXPECT(m2fn && m2fn(d, &m2) == NVML_SUCCESS && m2.total == L && m2.used == 1 << 20 && m2.free == L - (1 << 20),
           "nvml v2 total %llu used %llu", m2.total, m2.used);
    EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS);
    size_t tot = 0;
    EXPECT_RC(cuDeviceTotalMem_v2(&tot, 0), CUDA_SUCCESS);
    EXPECT(tot == L, "cuDeviceTotalMem %zu", tot);
}

/* the driver refuses (device smaller than the limit): the reservation is given back */
static void physfail(void)
{
    CUdeviceptr p;
    EXPECT_RC(cuMemAlloc_v2(&p, L - 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(t_used() == 0, "failed real allocation left usage %llu", t_used());
    size_t pitch;
    EXPECT_RC(cuMemAllocPitch_v2(&p, &pitch, L / 64, 64, 4), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(t_used() == 0, "failed pitch allocation left usage %llu", t_used());
}

int main(int argc, char **argv)
{
    L = strtoull(argv[1], NULL, 10);
    t_setup(0);
    if (argc > 2 && !strcmp(argv[2], "physfail")) {
        physfail();
        return t_done("t_apis physfail");
    }
    basic();
    odd_sizes();
    each_api();
    lookups();
    return t_done("t_apis");
}
