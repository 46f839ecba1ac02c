/* Where is device memory counted? Every device-memory path of the driver API (hook/README.md
 * lists each with its status): allocations reserve their size in the claim's usage region before
 * the real call and give it back if the call fails; frees release what the pointer table says;
 * arrays, VMM handles and mappings, context limits; paths that cannot be counted are refused on a
 * GPU of the claim (graph memory, CUDA < 3.2 entry points). What memory queries report: meminfo.c. */
#include <stdint.h>

#include "capture.h"
#include "devices.h"
#include "init.h"
#include "log.h"
#include "symbols.h"

/* ------------------------------------------------------------------ accounting */

/* Reserve before the real allocation, so two processes racing for the last bytes cannot
 * both succeed; 0 = go ahead. */
static int reserve(struct gpu_state *g, size_t size)
{
    return g->failed ? -1 : gs_region_reserve(&g->region, size, g->limit);
}

static void release(struct gpu_state *g, size_t size)
{
    if (!g->failed) gs_region_release(&g->region, size);
}

/* After the real allocation: undo the reservation on failure, else remember what a free
 * will release. (If the table cannot grow the bytes stay counted: never under-count.) */
static CUresult track(struct gpu_state *g, CUresult rc, int kind, uint64_t key, size_t size)
{
    if (rc != CUDA_SUCCESS) release(g, size);
    else gs_ptrmap_put(&g_ptrs, kind, key, size, g->index);
    return rc;
}

/* Before the real free: forget the entry (the driver may hand the address out again at once).
 * 1 = it was counted, *e says what. */
static int untrack(int kind, uint64_t key, struct gs_ptr_entry *e)
{
    ensure_cuda();
    return g_limits.mode != GS_MODE_NONE && !g_limits.failed && gs_ptrmap_take(&g_ptrs, kind, key, e);
}

/* After the real free: release what it held, or put the entry back if the free failed. */
static CUresult finish_free(CUresult rc, int known, const struct gs_ptr_entry *e)
{
    if (!known) return rc;
    if (rc == CUDA_SUCCESS) release(&g_gpu[e->gpu], e->size);
    else gs_ptrmap_put(&g_ptrs, e->kind, e->key, e->size, e->gpu);
    return rc;
}

/* Graph memory (memory nodes, and stream-ordered allocations made while capturing) lives in
 * a driver pool that is sized by graph launches and kept for relaunches until
 * cuDeviceGraphMemTrim: counting it at node creation would either keep the budget after the
 * graph is gone or under-count relaunches. Refused on a GPU of the claim. */
static CUresult graph_memory_refused(const char *what)
{
    static int logged;
    if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
        gs_log("%s refused: graph memory is not counted under a gpushare claim", what);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ------------------------------------------------------------------ allocations and frees
 * Each allocation: no claim on this device (g NULL) or size 0 passes through; else reserve,
 * allocate, track. Each free: untrack, free, finish_free. */

HOOK CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    struct gpu_state *g = current_gpu();
    if (!g || size == 0) return real_cuMemAlloc_v2(dptr, size);
    if (reserve(g, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_cuMemAlloc_v2(dptr, size);
    return track(g, rc, GS_KIND_PTR, rc == CUDA_SUCCESS ? *dptr : 0, size);
}

HOOK CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    struct gpu_state *g = current_gpu();
    if (!g || size == 0) return real_cuMemAllocManaged(dptr, size, flags);
    if (reserve(g, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_cuMemAllocManaged(dptr, size, flags);
    return track(g, rc, GS_KIND_PTR, rc == CUDA_SUCCESS ? *dptr : 0, size);
}

/* Stream-ordered allocations count when enqueued (against the current context's device).
 * On a capturing stream they would become graph memory nodes: refused (graph_memory_refused). */
HOOK CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s)
{
    struct gpu_state *g = current_gpu();
    if (g && capturing(s, 0)) return graph_memory_refused("cuMemAllocAsync on a capturing stream");
    if (!g || size == 0) return real_cuMemAllocAsync(dptr, size, s);
    if (reserve(g, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_cuMemAllocAsync(dptr, size, s);
    return track(g, rc, GS_KIND_PTR, rc == CUDA_SUCCESS ? *dptr : 0, size);
}

HOOK CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s)
{
    struct gpu_state *g = current_gpu();
    if (g && capturing(s, 1)) return graph_memory_refused("cuMemAllocAsync on a capturing stream");
    if (!g || size == 0) return real_cuMemAllocAsync_ptsz(dptr, size, s);
    if (reserve(g, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_cuMemAllocAsync_ptsz(dptr, size, s);
    return track(g, rc, GS_KIND_PTR, rc == CUDA_SUCCESS ? *dptr : 0, size);
}

HOOK CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{
    struct gpu_state *g = current_gpu();
    if (g && capturing(s, 0)) return graph_memory_refused("cuMemAllocFromPoolAsync on a capturing stream");
    if (!g || size == 0) return real_cuMemAllocFromPoolAsync(dptr, size, pool, s);
    if (reserve(g, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_cuMemAllocFromPoolAsync(dptr, size, pool, s);
    return track(g, rc, GS_KIND_PTR, rc == CUDA_SUCCESS ? *dptr : 0, size);
}

HOOK CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{
    struct gpu_state *g = current_gpu();
    if (g && capturing(s, 1)) return graph_memory_refused("cuMemAllocFromPoolAsync on a capturing stream");
    if (!g || size == 0) return real_cuMemAllocFromPoolAsync_ptsz(dptr, size, pool, s);
    if (reserve(g, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_cuMemAllocFromPoolAsync_ptsz(dptr, size, pool, s);
    return track(g, rc, GS_KIND_PTR, rc == CUDA_SUCCESS ? *dptr : 0, size);
}

HOOK CUresult cuMemFree_v2(CUdeviceptr p)
{
    struct gs_ptr_entry e;
    int known = untrack(GS_KIND_PTR, p, &e);
    return finish_free(real_cuMemFree_v2(p), known, &e);
}

HOOK CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    struct gs_ptr_entry e;
    int known = untrack(GS_KIND_PTR, p, &e);
    return finish_free(real_cuMemFreeAsync(p, s), known, &e);
}

HOOK CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    struct gs_ptr_entry e;
    int known = untrack(GS_KIND_PTR, p, &e);
    return finish_free(real_cuMemFreeAsync_ptsz(p, s), known, &e);
}

/* The pitch is known only afterwards: reserve an estimate, then settle on pitch * height. */
HOOK CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                 unsigned int elem)
{
    struct gpu_state *g = current_gpu();
    size_t est = gs_mul_sat(width > SIZE_MAX - 511 ? SIZE_MAX : (width + 511) & ~(size_t)511, height);
    if (!g || est == 0) return real_cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
    if (reserve(g, est) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
    if (rc != CUDA_SUCCESS) return track(g, rc, GS_KIND_PTR, 0, est);
    size_t actual = gs_mul_sat(*pitch, height);
    if (actual > est && reserve(g, actual - est) != 0) {
        real_cuMemFree_v2(*dptr);
        release(g, est);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < est) release(g, est - actual);
    return track(g, rc, GS_KIND_PTR, *dptr, actual);
}

/* ------------------------------------------------------------------ arrays (size estimated from the descriptor) */

HOOK CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    struct gpu_state *g = current_gpu();
    size_t size = d ? gs_array_bytes(d) : 0;
    if (!g || size == 0) return real_cuArrayCreate_v2(a, d);
    if (reserve(g, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_cuArrayCreate_v2(a, d);
    return track(g, rc, GS_KIND_ARRAY, rc == CUDA_SUCCESS ? (uintptr_t)*a : 0, size);
}

HOOK CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    struct gpu_state *g = current_gpu();
    size_t size = d ? gs_array3d_bytes(d, 1) : 0;
    if (!g || size == 0) return real_cuArray3DCreate_v2(a, d);
    if (reserve(g, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_cuArray3DCreate_v2(a, d);
    return track(g, rc, GS_KIND_ARRAY, rc == CUDA_SUCCESS ? (uintptr_t)*a : 0, size);
}

HOOK CUresult cuArrayDestroy(CUarray a)
{
    struct gs_ptr_entry e;
    int known = untrack(GS_KIND_ARRAY, (uintptr_t)a, &e);
    return finish_free(real_cuArrayDestroy(a), known, &e);
}

HOOK CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                     unsigned int levels)
{
    struct gpu_state *g = current_gpu();
    size_t size = d ? gs_array3d_bytes(d, levels) : 0;
    if (!g || size == 0) return real_cuMipmappedArrayCreate(m, d, levels);
    if (reserve(g, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_cuMipmappedArrayCreate(m, d, levels);
    return track(g, rc, GS_KIND_MIPMAP, rc == CUDA_SUCCESS ? (uintptr_t)*m : 0, size);
}

HOOK CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
    struct gs_ptr_entry e;
    int known = untrack(GS_KIND_MIPMAP, (uintptr_t)m, &e);
    return finish_free(real_cuMipmappedArrayDestroy(m), known, &e);
}

/* ------------------------------------------------------------------ VMM
 * Only device locations count; host memory passes through. The driver frees a handle's memory
 * when it is released *and* unmapped. A counted handle carries its number of mappings; released
 * while mapped, it stays counted (as GS_KIND_VMM_RELEASED) until its last mapping goes. */

HOOK CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                          unsigned long long flags)
{
    int dev = prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
    struct gpu_state *g = dev >= 0 ? gpu_for_device(dev) : (ensure_cuda(), NULL);
    if (!g || size == 0) return real_cuMemCreate(h, size, prop, flags);
    if (reserve(g, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_cuMemCreate(h, size, prop, flags);
    return track(g, rc, GS_KIND_VMM, rc == CUDA_SUCCESS ? *h : 0, size);
}

static int handle_maps(uint64_t h, int delta)
{
    struct gs_ptr_entry e;
    int kind = GS_KIND_VMM;
    if (!gs_ptrmap_take(&g_ptrs, kind, h, &e)) {
        kind = GS_KIND_VMM_RELEASED;
        if (!gs_ptrmap_take(&g_ptrs, kind, h, &e)) return -1; /* not counted (host memory, no claim) */
    }
    e.aux = delta < 0 && e.aux == 0 ? 0 : e.aux + (uint64_t)(int64_t)delta;
    if (kind == GS_KIND_VMM_RELEASED && e.aux == 0) release(&g_gpu[e.gpu], e.size);
    else gs_ptrmap_put_entry(&g_ptrs, &e);
    return 0;
}

HOOK CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                       unsigned long long flags)
{
    ensure_cuda();
    CUresult rc = real_cuMemMap(p, size, offset, h, flags);
    if (rc == CUDA_SUCCESS && g_limits.mode != GS_MODE_NONE && handle_maps(h, +1) == 0) {
        struct gs_ptr_entry m = {p, size, 0, GS_KIND_MAP, h};
        gs_ptrmap_put_entry(&g_ptrs, &m);
    }
    return rc;
}

/* The range may cover several mappings, each starting where the previous one ends. */
HOOK CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
    ensure_cuda();
    CUresult rc = real_cuMemUnmap(p, size);
    struct gs_ptr_entry m;
    for (uint64_t a = p; rc == CUDA_SUCCESS && a - p < size && gs_ptrmap_take(&g_ptrs, GS_KIND_MAP, a, &m);
         a += m.size ? m.size : size)
        handle_maps(m.aux, -1);
    return rc;
}

HOOK CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    struct gs_ptr_entry e;
    int known = untrack(GS_KIND_VMM, h, &e);
    CUresult rc = real_cuMemRelease(h);
    if (known && rc == CUDA_SUCCESS && e.aux > 0) { /* still mapped: still counted */
        e.kind = GS_KIND_VMM_RELEASED;
        gs_ptrmap_put_entry(&g_ptrs, &e);
        return rc;
    }
    return finish_free(rc, known, &e);
}

/* ------------------------------------------------------------------ refused paths */

/* CUDA < 3.2 entry points (32-bit sizes and pointers), reached by name or through
 * cuGetProcAddress with a version below 3020: no toolkit since 2010 calls them, so on a GPU of
 * the claim they are refused rather than counted a second way. */
static CUresult legacy_refused(const char *name)
{
    static int logged;
    if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
        gs_log("%s (CUDA < 3.2 entry point) refused under a gpushare claim; use the _v2 entry points", name);
    return CUDA_ERROR_NOT_SUPPORTED;
}

HOOK CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size)
{
    return current_gpu() ? legacy_refused("cuMemAlloc") : real_cuMemAlloc(dptr, size);
}

HOOK CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
                              unsigned int elem)
{
    return current_gpu() ? legacy_refused("cuMemAllocPitch") : real_cuMemAllocPitch(dptr, pitch, width, height, elem);
}

HOOK CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    return current_gpu() ? legacy_refused("cuArrayCreate") : real_cuArrayCreate(a, d);
}

HOOK CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    return current_gpu() ? legacy_refused("cuArray3DCreate") : real_cuArray3DCreate(a, d);
}

static int on_claim_device(const CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    int dev = p && p->poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? p->poolProps.location.id : -1;
    if (dev < 0) {
        ensure_cuda();
        return 0;
    }
    return gpu_for_device(dev) != NULL;
}

HOOK CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                     CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    if (on_claim_device(params)) return graph_memory_refused("cuGraphAddMemAllocNode");
    return real_cuGraphAddMemAllocNode(node, graph, deps, ndeps, params);
}

static int is_claim_alloc_node(const CUgraphNodeParams *p)
{
    return p && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && on_claim_device(&p->alloc);
}

HOOK CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                             CUgraphNodeParams *params)
{
    if (is_claim_alloc_node(params)) return graph_memory_refused("cuGraphAddNode (memory allocation node)");
    ensure_cuda();
    return real_cuGraphAddNode(node, graph, deps, ndeps, params);
}

HOOK CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                const CUgraphEdgeData *edges, size_t ndeps, CUgraphNodeParams *params)
{
    if (is_claim_alloc_node(params)) return graph_memory_refused("cuGraphAddNode (memory allocation node)");
    ensure_cuda();
    return real_cuGraphAddNode_v2(node, graph, deps, edges, ndeps, params);
}

/* ------------------------------------------------------------------ context limits
 * Context limits that reserve device memory beyond what the context starts with: the
 * in-kernel malloc heap, the printf FIFO (bytes), and the per-thread stack (bytes times every
 * thread the GPU can hold). Counted above the driver's defaults, per context, until changed or
 * the context is destroyed. Other limits reserve no device memory of note. */

static uint64_t limit_bytes(int limit, size_t value, CUdevice dev)
{
    static const uint64_t defaults[] = {1024, 1 << 20, 8 << 20}; /* stack, printf FIFO, heap */
    if (limit < 0 || limit > CU_LIMIT_MALLOC_HEAP_SIZE || value <= defaults[limit]) return 0;
    uint64_t extra = value - defaults[limit];
    if (limit != CU_LIMIT_STACK_SIZE) return extra;
    int sms = 0, threads = 0;
    if (real_cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS || sms <= 0)
        sms = 1;
    if (real_cuDeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) != CUDA_SUCCESS ||
        threads <= 0)
        threads = 2048;
    return gs_mul_sat(extra, (size_t)sms * (size_t)threads);
}

static uint64_t ctx_limit_key(CUcontext c, int limit) { return ((uint64_t)(uintptr_t)c << 2) | (uint64_t)limit; }

HOOK CUresult cuCtxSetLimit(int limit, size_t value)
{
    struct gpu_state *g = current_gpu();
    CUcontext c;
    CUdevice dev;
    if (!g || limit < 0 || limit > CU_LIMIT_MALLOC_HEAP_SIZE || real_cuCtxGetCurrent(&c) != CUDA_SUCCESS ||
        real_cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return real_cuCtxSetLimit(limit, value);
    struct gs_ptr_entry old = {0};
    int had = gs_ptrmap_take(&g_ptrs, GS_KIND_CTX_LIMIT, ctx_limit_key(c, limit), &old);
    uint64_t want = limit_bytes(limit, value, dev), have = had ? old.size : 0;
    if (want > have && reserve(g, want - have) != 0) {
        if (had) gs_ptrmap_put_entry(&g_ptrs, &old);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = real_cuCtxSetLimit(limit, value);
    uint64_t keep = rc == CUDA_SUCCESS ? want : have;
    if (want > have && rc != CUDA_SUCCESS) release(g, want - have);
    if (want < have && rc == CUDA_SUCCESS) release(g, have - want);
    if (keep) gs_ptrmap_put(&g_ptrs, GS_KIND_CTX_LIMIT, ctx_limit_key(c, limit), keep, g->index);
    return rc;
}

/* A destroyed context releases its counted limits, and stops being the context pacing knows
 * the MPS share of (pacing.c, mps_scale): a new context may get its address. */
HOOK CUresult cuCtxDestroy_v2(CUcontext c)
{
    ensure_cuda();
    CUresult rc = real_cuCtxDestroy_v2(c);
    for (int i = 0; rc == CUDA_SUCCESS && i < GS_MAX_GPUS; i++)
        if (g_gpu_open[i]) __atomic_store_n(&g_gpu[i].mps_ctx, NULL, __ATOMIC_RELEASE);
    struct gs_ptr_entry e;
    for (int limit = 0; rc == CUDA_SUCCESS && limit <= CU_LIMIT_MALLOC_HEAP_SIZE; limit++)
        if (gs_ptrmap_take(&g_ptrs, GS_KIND_CTX_LIMIT, ctx_limit_key(c, limit), &e)) release(&g_gpu[e.gpu], e.size);
    return rc;
}
