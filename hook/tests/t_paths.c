/* The device-memory paths beside the usual allocators (hook/README.md lists them all):
 * legacy CUDA < 3.2 entry points (by name and through cuGetProcAddress below 3020), graph
 * memory nodes, stream-ordered allocations while capturing, VMM handles released while still
 * mapped, and context limits that reserve device memory.
 * usage: t_paths LIMIT           (with libgpushare.so preloaded: counted or refused)
 *        t_paths LIMIT nohook    (without: the simulated driver serves every path, so the
 *                                 refusals above come from the library) */
#include "testlib.h"

#define MiB (1ull << 20)

static int nohook;

/* refused with the library, served without it */
#define EXPECT_REFUSED(call) EXPECT_RC(call, nohook ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED)

static void legacy(void)
{
    CUdeviceptr_v1 p;
    unsigned int pitch;
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR_v1 d = {256, 256, 0x20, 1};
    CUDA_ARRAY3D_DESCRIPTOR_v1 d3 = {64, 64, 4, 0x20, 1, 0};
    EXPECT_REFUSED(cuMemAlloc(&p, 1 << 20));
    EXPECT_REFUSED(cuMemAllocPitch(&p, &pitch, 1000, 10, 4));
    EXPECT_REFUSED(cuArrayCreate(&a, &d));
    EXPECT_REFUSED(cuArray3DCreate(&a, &d3));
    /* the CUDA < 3.2 name through cuGetProcAddress, as an old runtime would ask */
    void *fn = NULL;
    EXPECT_RC(cuGetProcAddress_v2("cuMemAlloc", &fn, 3000, 0, NULL), CUDA_SUCCESS);
    EXPECT(fn != NULL, "no cuMemAlloc below 3020");
    if (fn) EXPECT_REFUSED(((__typeof__(&cuMemAlloc))fn)(&p, 1 << 20));
    EXPECT_RC(cuGetProcAddress_v2("cuArrayCreate", &fn, 3010, 0, NULL), CUDA_SUCCESS);
    if (fn) EXPECT_REFUSED(((__typeof__(&cuArrayCreate))fn)(&a, &d));
    /* the _v2 entry through the same call still counts */
    EXPECT_RC(cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, NULL), CUDA_SUCCESS);
    CUdeviceptr p2;
    if (fn) EXPECT_RC(((__typeof__(&cuMemAlloc_v2))fn)(&p2, MiB), CUDA_SUCCESS);
    if (!nohook) EXPECT(t_used() == MiB, "v2 through cuGetProcAddress: used %llu", t_used());
    cuMemFree_v2(p2);
}

static void graphs(void)
{
    CUgraph g;
    CUgraphNode n;
    CUstream s;
    CUdeviceptr p;
    EXPECT_RC(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.poolProps.location.id = 0;
    ap.bytesize = 1ull << 40; /* would exceed any claim */
    EXPECT_REFUSED(cuGraphAddMemAllocNode(&n, g, NULL, 0, &ap));
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    np.alloc = ap;
    EXPECT_REFUSED(cuGraphAddNode(&n, g, NULL, 0, &np));
    EXPECT_REFUSED(cuGraphAddNode_v2(&n, g, NULL, NULL, 0, &np));
    np.type = 0; /* a kernel node: not memory, passes */
    EXPECT_RC(cuGraphAddNode(&n, g, NULL, 0, &np), CUDA_SUCCESS);
    cuGraphDestroy(g);

    EXPECT_RC(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    EXPECT_RC(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    EXPECT_REFUSED(cuMemAllocAsync(&p, MiB, s));
    EXPECT_REFUSED(cuMemAllocFromPoolAsync(&p, MiB, NULL, s));
    EXPECT_RC(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    if (nohook) { /* the sim allocated those two for real */
        cuMemFreeAsync(p, s);
        return;
    }
    EXPECT_RC(cuMemAllocAsync(&p, MiB, s), CUDA_SUCCESS); /* not capturing: counted */
    EXPECT(t_used() == MiB, "async after capture: used %llu", t_used());
    EXPECT_RC(cuMemFreeAsync(p, s), CUDA_SUCCESS);
}

static void vmm(unsigned long long limit)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h1, h2;
    CUdeviceptr va, p;
    EXPECT_RC(cuMemCreate(&h1, limit / 2, &prop, 0), CUDA_SUCCESS);
    EXPECT_RC(cuMemCreate(&h2, limit / 2, &prop, 0), CUDA_SUCCESS);
    EXPECT_RC(cuMemAddressReserve(&va, limit, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_RC(cuMemMap(va, limit / 2, 0, h1, 0), CUDA_SUCCESS);
    EXPECT_RC(cuMemMap(va + limit / 2, limit / 2, 0, h2, 0), CUDA_SUCCESS);
    EXPECT_RC(cuMemRelease(h1), CUDA_SUCCESS); /* mapped: the memory is not gone */
    EXPECT_RC(cuMemRelease(h2), CUDA_SUCCESS);
    EXPECT(t_used() == limit, "released while mapped: used %llu", t_used());
    EXPECT_RC(cuMemAlloc_v2(&p, MiB), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemUnmap(va, limit), CUDA_SUCCESS); /* one call, both mappings */
    EXPECT(t_used() == 0, "after unmap: used %llu", t_used());
    /* released after unmapping: freed at the release */
    EXPECT_RC(cuMemCreate(&h1, limit / 2, &prop, 0), CUDA_SUCCESS);
    EXPECT_RC(cuMemMap(va, limit / 2, 0, h1, 0), CUDA_SUCCESS);
    EXPECT_RC(cuMemUnmap(va, limit / 2), CUDA_SUCCESS);
    EXPECT(t_used() == limit / 2, "unmapped, not released: used %llu", t_used());
    EXPECT_RC(cuMemRelease(h1), CUDA_SUCCESS);
    EXPECT(t_used() == 0, "unmapped then released: used %llu", t_used());
}

static void ctx_limits(unsigned long long limit)
{
    CUdeviceptr p;
    EXPECT_RC(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, (8 << 20) + limit / 2), CUDA_SUCCESS);
    EXPECT(t_used() == limit / 2, "heap: used %llu", t_used());
    EXPECT_RC(cuMemAlloc_v2(&p, limit / 2 + 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 << 20 | 2 * limit), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, (1 << 20) + limit / 4), CUDA_SUCCESS);
    EXPECT(t_used() == limit / 2 + limit / 4, "heap + fifo: used %llu", t_used());
    EXPECT_RC(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 << 20), CUDA_SUCCESS); /* back to the default */
    EXPECT(t_used() == limit / 4, "fifo: used %llu", t_used());
    /* stack: per thread, times every thread the GPU holds (132 SMs x 2048 in the sim) */
    EXPECT_RC(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024 + limit / (132 * 2048) * 2), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024 + 64), CUDA_SUCCESS);
    EXPECT(t_used() == limit / 4 + 64ull * 132 * 2048, "fifo + stack: used %llu", t_used());
    EXPECT_RC(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 1 << 20), CUDA_SUCCESS);
    EXPECT(t_used() == 0, "defaults again: used %llu", t_used());
    /* a context's limits go with it */
    CUcontext c, prev;
    cuCtxGetCurrent(&prev);
    EXPECT_RC(cuCtxCreate_v2(&c, 0, 0), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, (8 << 20) + limit / 2), CUDA_SUCCESS);
    EXPECT(t_used() == limit / 2, "new context's heap: used %llu", t_used());
    EXPECT_RC(cuCtxDestroy_v2(c), CUDA_SUCCESS);
    cuCtxSetCurrent(prev);
    EXPECT(t_used() == 0, "after destroying the context: used %llu", t_used());
}

int main(int argc, char **argv)
{
    if (argc < 2) return 64;
    unsigned long long limit = strtoull(argv[1], NULL, 0);
    nohook = argc > 2 && !strcmp(argv[2], "nohook");
    t_setup(0);
    legacy();
    graphs();
    if (!nohook) {
        vmm(limit);
        ctx_limits(limit);
        EXPECT(t_used() == 0, "at the end: used %llu", t_used());
    }
    return t_done(nohook ? "t_paths nohook" : "t_paths");
}
