/* What do memory queries report? cuMemGetInfo_v2, cuDeviceTotalMem_v2 and
 * nvmlDeviceGetMemoryInfo(_v2) on a GPU of the claim: total = min(limit, physical),
 * free = max(0, total - claim usage) and never more than the physical free, NVML used = the
 * claim's usage; 0 everywhere when the GPU fails closed. */
#include "devices.h"
#include "init.h"
#include "symbols.h"

static void report(struct gpu_state *g, uint64_t phys_total, uint64_t phys_free, uint64_t *total,
                   uint64_t *free_b, uint64_t *used)
{
    if (g->failed) {
        *total = *free_b = *used = 0;
        return;
    }
    gs_region_reap(&g->region, 1000000000ull); /* at most once a second, never waits */
    uint64_t t = g->limit < phys_total ? g->limit : phys_total;
    uint64_t u = gs_region_used(&g->region, g->limit);
    uint64_t f = u < t ? t - u : 0;
    *total = t;
    *free_b = f < phys_free ? f : phys_free;
    *used = u;
}

HOOK CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    struct gpu_state *g = current_gpu();
    CUresult rc = real_cuMemGetInfo_v2(free_b, total_b);
    if (g && rc == CUDA_SUCCESS && free_b && total_b) {
        uint64_t t, f, u;
        report(g, *total_b, *free_b, &t, &f, &u);
        *total_b = t;
        *free_b = f;
    }
    return rc;
}

HOOK CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    struct gpu_state *g = gpu_for_device(dev);
    CUresult rc = real_cuDeviceTotalMem_v2(bytes, dev);
    if (g && rc == CUDA_SUCCESS && bytes) {
        uint64_t t, f, u;
        report(g, *bytes, *bytes, &t, &f, &u);
        *bytes = t;
    }
    return rc;
}

HOOK nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    ensure_nvml();
    nvmlReturn_t rc = real_nvmlDeviceGetMemoryInfo(d, m);
    struct gpu_state *g = rc == NVML_SUCCESS && m ? gpu_for_nvml(d) : NULL;
    if (g) {
        uint64_t t, f, u;
        report(g, m->total, m->free, &t, &f, &u);
        m->total = t, m->free = f, m->used = u;
    }
    return rc;
}

HOOK nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    ensure_nvml();
    nvmlReturn_t rc = real_nvmlDeviceGetMemoryInfo_v2(d, m);
    struct gpu_state *g = rc == NVML_SUCCESS && m ? gpu_for_nvml(d) : NULL;
    if (g) {
        uint64_t t, f, u;
        report(g, m->total, m->free, &t, &f, &u);
        m->total = t, m->free = f, m->used = u, m->reserved = 0;
    }
    return rc;
}
