/* Which of the claim's GPUs is this device? A device maps to limit slot i by UUID, else by
 * ordinal unless slot i's UUID names another visible device; devices not in the claim pass
 * through. CUDA ordinals and NVML indices are mapped separately (each asks its own library for
 * UUIDs), once per device, and a slot's state (region, control file) is opened at its first use. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "devices.h"
#include "init.h"
#include "symbols.h"

#define MAX_DEV 64
static struct gpu_state *g_cuda_map[MAX_DEV], *g_nvml_map[MAX_DEV]; /* under g_map_lock (state.h) */
static struct gpu_state g_failclosed = {.index = -1, .failed = 1};
static struct gpu_state g_unmanaged; /* sentinel: device not under the claim */

static struct gpu_state *open_slot(int i)
{
    struct gpu_state *g = &g_gpu[i];
    if (g_gpu_open[i]) return g;
    g->index = i;
    g->limit = g_limits.gpu[i].memory;
    g->compute = g_limits.gpu[i].compute;
    g->burst = g_limits.gpu[i].burst;
    g->mps = g_limits.mps;
    g->sm_count = g_limits.gpu[i].sm_count;
    pthread_mutex_init(&g->sample_lock, NULL);
    pthread_mutex_init(&g->turn_lock, NULL);
    char path[4200];
    snprintf(path, sizeof path, "%s/region/%d", g_limits.dir, i);
    g->failed = gs_region_open(&g->region, g_limits.mode == GS_MODE_ENV ? NULL : path) != 0;
#ifdef GS_TEST_FAULTS
    g->region.fault_stop = g_fault_stop;
#endif
    if (g_limits.mode != GS_MODE_ENV && !g->failed && g->compute < 100) /* only pacing reads it */
        g->control = gs_control_open(g_limits.dir, i);
    g_gpu_open[i] = 1;
    return g;
}

/* The limit slot of a device: the slot whose UUID matches; else the slot at the device's
 * ordinal, unless that slot names another visible device. uuid_at(i) gives the UUID of the
 * driver's device i ("" if unknown). */
static struct gpu_state *state_for(int ordinal, int count, void (*uuid_at)(int, char *))
{
    char uuid[96], other[96];
    if (g_limits.mode == GS_MODE_NONE) return &g_unmanaged;
    if (g_limits.failed) return &g_failclosed;
    uuid_at(ordinal, uuid);
    for (int i = 0; uuid[0] && i < g_limits.count; i++)
        if (strcmp(g_limits.gpu[i].uuid, uuid) == 0) return open_slot(i);
    if (ordinal < 0 || ordinal >= g_limits.count) return &g_unmanaged;
    for (int d = 0; g_limits.gpu[ordinal].uuid[0] && d < count; d++) {
        uuid_at(d, other);
        if (d != ordinal && strcmp(other, g_limits.gpu[ordinal].uuid) == 0) return &g_unmanaged;
    }
    return open_slot(ordinal);
}

static void format_uuid(const unsigned char *b, char *out)
{
    sprintf(out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
            b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
            b[15]);
}

static struct gpu_state *lookup(struct gpu_state **map, int idx, struct gpu_state *(*find)(int))
{
    if (idx < 0 || idx >= MAX_DEV) return NULL;
    struct gpu_state *g = __atomic_load_n(&map[idx], __ATOMIC_ACQUIRE);
    if (UNLIKELY(!g)) {
        pthread_mutex_lock(&g_map_lock);
        g = map[idx];
        if (!g) {
            g = find(idx);
            __atomic_store_n(&map[idx], g, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&g_map_lock);
    }
    return g == &g_unmanaged ? NULL : g;
}

static void cuda_uuid_at(int dev, char *out)
{
    CUuuid u;
    out[0] = 0;
    if (real_cuDeviceGetUuid_v2(&u, dev) == CUDA_SUCCESS) format_uuid((unsigned char *)u.bytes, out);
}

static struct gpu_state *find_cuda(int dev)
{
    int count = 0;
    if (real_cuDeviceGetCount(&count) != CUDA_SUCCESS) count = 0;
    return state_for(dev, count, cuda_uuid_at);
}

struct gpu_state *gpu_for_device(CUdevice dev)
{
    ensure_cuda();
    if (g_limits.mode == GS_MODE_NONE) return NULL;
    return lookup(g_cuda_map, dev, find_cuda);
}

struct gpu_state *current_gpu(void)
{
    CUdevice dev;
    ensure_cuda();
    if (g_limits.mode == GS_MODE_NONE || real_cuCtxGetDevice(&dev) != CUDA_SUCCESS) return NULL;
    return lookup(g_cuda_map, dev, find_cuda);
}

static void nvml_uuid_at(int idx, char *out)
{
    nvmlDevice_t d;
    out[0] = 0;
    if (real_nvmlDeviceGetHandleByIndex_v2((unsigned)idx, &d) != NVML_SUCCESS ||
        real_nvmlDeviceGetUUID(d, out, 96) != NVML_SUCCESS)
        out[0] = 0;
}

static struct gpu_state *find_nvml(int idx)
{
    unsigned int count = 0;
    if (real_nvmlDeviceGetCount_v2(&count) != NVML_SUCCESS) count = 0;
    return state_for(idx, (int)count, nvml_uuid_at);
}

struct gpu_state *gpu_for_nvml(nvmlDevice_t d)
{
    unsigned int idx;
    if (g_limits.mode == GS_MODE_NONE || real_nvmlDeviceGetIndex(d, &idx) != NVML_SUCCESS) return NULL;
    return lookup(g_nvml_map, (int)idx, find_nvml);
}
