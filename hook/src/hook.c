/* libgpushare.so: keeps every process of a claim, together, within the claim's memory and
 * compute limits on each GPU. Preloaded into every process of the container, so it does
 * nothing at all until the first CUDA or NVML call: no constructor, thread, file or mapping.
 *
 * How calls reach us: exported symbols (applications linked against libcuda), our dlsym
 * (dlopen + dlsym, as the CUDA runtime, PyTorch and pynvml do), and cuGetProcAddress(_v2),
 * whose answers we swap for our hooks. The real functions come from our own dlopen handle
 * of libcuda.so.1 / libnvidia-ml.so.1 and the real dlsym, never through ourselves. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "control.h"
#include "cuda_abi.h"
#include "limits.h"
#include "log.h"
#include "ptrmap.h"
#include "rawstat.h"
#include "region.h"
#include "dlsym.h"

#define HOOK __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
/* dlsym runs inside sanitizer start-up (ASan builds resolve their interceptors through it),
 * before shadow memory exists: that path must not be instrumented */
#define NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

/* ------------------------------------------------------------------ real entry points */

#define REAL(sym) static __typeof__(&sym) real_##sym
REAL(cuGetProcAddress); REAL(cuGetProcAddress_v2);
REAL(cuMemGetInfo_v2); REAL(cuDeviceTotalMem_v2);
REAL(cuMemAlloc_v2); REAL(cuMemAllocPitch_v2); REAL(cuMemAllocManaged); REAL(cuMemFree_v2);
REAL(cuMemAllocAsync); REAL(cuMemAllocAsync_ptsz);
REAL(cuMemAllocFromPoolAsync); REAL(cuMemAllocFromPoolAsync_ptsz);
REAL(cuMemFreeAsync); REAL(cuMemFreeAsync_ptsz);
REAL(cuMemCreate); REAL(cuMemRelease);
REAL(cuArrayCreate_v2); REAL(cuArray3DCreate_v2); REAL(cuArrayDestroy);
REAL(cuMipmappedArrayCreate); REAL(cuMipmappedArrayDestroy);
REAL(cuMemAlloc); REAL(cuMemAllocPitch); REAL(cuArrayCreate); REAL(cuArray3DCreate);
REAL(cuGraphAddMemAllocNode); REAL(cuGraphAddNode); REAL(cuGraphAddNode_v2);
REAL(cuMemMap); REAL(cuMemUnmap); REAL(cuCtxSetLimit); REAL(cuCtxDestroy_v2);
REAL(cuLaunchKernel); REAL(cuLaunchKernel_ptsz);
REAL(cuLaunchKernelEx); REAL(cuLaunchKernelEx_ptsz);
REAL(cuLaunchCooperativeKernel); REAL(cuLaunchCooperativeKernel_ptsz);
REAL(cuGraphLaunch); REAL(cuGraphLaunch_ptsz);
REAL(cuStreamBeginCapture); REAL(cuStreamBeginCapture_ptsz);
REAL(cuStreamBeginCapture_v2); REAL(cuStreamBeginCapture_v2_ptsz);
REAL(cuStreamEndCapture); REAL(cuStreamEndCapture_ptsz);
REAL(cuStreamIsCapturing); REAL(cuStreamIsCapturing_ptsz);
REAL(nvmlDeviceGetMemoryInfo); REAL(nvmlDeviceGetMemoryInfo_v2);
/* not hooked, only called by us */
REAL(cuCtxGetDevice); REAL(cuDeviceGetUuid_v2); REAL(cuDeviceGetCount); REAL(cuEventCreate); REAL(cuEventDestroy_v2);
REAL(cuEventRecord); REAL(cuEventRecord_ptsz); REAL(cuEventQuery); REAL(cuEventSynchronize);
REAL(cuEventElapsedTime_v2);
REAL(nvmlDeviceGetUUID); REAL(nvmlDeviceGetIndex); REAL(nvmlDeviceGetCount_v2);
REAL(nvmlDeviceGetHandleByIndex_v2);
REAL(cuCtxGetCurrent); REAL(cuDeviceGetAttribute); REAL(cuCtxGetExecAffinity);

enum { LIB_CUDA, LIB_NVML };

struct hook {
    const char *name;  /* exported (versioned) symbol */
    void *hook;        /* ours; NULL = helper we only call */
    void **real;
    int lib;
    const char *base;  /* cuGetProcAddress name, when it asks by base name */
    int min_version;   /* first CUDA version whose base name means this symbol */
    int ptsz;          /* per-thread default stream variant */
};

#define H(sym, base, ver, ptsz) {#sym, (void *)sym, (void **)&real_##sym, LIB_CUDA, base, ver, ptsz}
#define N(sym) {#sym, (void *)sym, (void **)&real_##sym, LIB_NVML, #sym, 0, 0}
#define HELPER(sym, lib) {#sym, NULL, (void **)&real_##sym, lib, "", 0, 0}
static const struct hook hooks[] = {
    H(cuGetProcAddress, "cuGetProcAddress", 0, 0),
    H(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0),
    H(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0),
    H(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0),
    H(cuMemAlloc_v2, "cuMemAlloc", 3020, 0),
    H(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0),
    H(cuMemAllocManaged, "cuMemAllocManaged", 0, 0),
    H(cuMemFree_v2, "cuMemFree", 3020, 0),
    H(cuMemAllocAsync, "cuMemAllocAsync", 0, 0),
    H(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 0, 1),
    H(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 0, 0),
    H(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 0, 1),
    H(cuMemFreeAsync, "cuMemFreeAsync", 0, 0),
    H(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 0, 1),
    H(cuMemCreate, "cuMemCreate", 0, 0),
    H(cuMemRelease, "cuMemRelease", 0, 0),
    H(cuArrayCreate_v2, "cuArrayCreate", 3020, 0),
    H(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0),
    H(cuArrayDestroy, "cuArrayDestroy", 0, 0),
    H(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 0, 0),
    H(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 0, 0),
    H(cuMemAlloc, "cuMemAlloc", 0, 0),
    H(cuMemAllocPitch, "cuMemAllocPitch", 0, 0),
    H(cuArrayCreate, "cuArrayCreate", 0, 0),
    H(cuArray3DCreate, "cuArray3DCreate", 0, 0),
    H(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", 0, 0),
    H(cuGraphAddNode, "cuGraphAddNode", 0, 0),
    H(cuGraphAddNode_v2, "cuGraphAddNode", 12030, 0),
    H(cuMemMap, "cuMemMap", 0, 0),
    H(cuMemUnmap, "cuMemUnmap", 0, 0),
    H(cuCtxSetLimit, "cuCtxSetLimit", 0, 0),
    H(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0),
    H(cuLaunchKernel, "cuLaunchKernel", 0, 0),
    H(cuLaunchKernel_ptsz, "cuLaunchKernel", 0, 1),
    H(cuLaunchKernelEx, "cuLaunchKernelEx", 0, 0),
    H(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 0, 1),
    H(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 0, 0),
    H(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 0, 1),
    H(cuGraphLaunch, "cuGraphLaunch", 0, 0),
    H(cuGraphLaunch_ptsz, "cuGraphLaunch", 0, 1),
    H(cuStreamBeginCapture, "cuStreamBeginCapture", 0, 0),
    H(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 0, 1),
    H(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, 0),
    H(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, 1),
    H(cuStreamEndCapture, "cuStreamEndCapture", 0, 0),
    H(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 0, 1),
    N(nvmlDeviceGetMemoryInfo),
    N(nvmlDeviceGetMemoryInfo_v2),
    HELPER(cuCtxGetDevice, LIB_CUDA), HELPER(cuDeviceGetUuid_v2, LIB_CUDA), HELPER(cuDeviceGetCount, LIB_CUDA),
    HELPER(cuEventCreate, LIB_CUDA), HELPER(cuEventDestroy_v2, LIB_CUDA),
    HELPER(cuEventRecord, LIB_CUDA), HELPER(cuEventRecord_ptsz, LIB_CUDA),
    HELPER(cuEventQuery, LIB_CUDA), HELPER(cuEventSynchronize, LIB_CUDA),
    HELPER(cuEventElapsedTime_v2, LIB_CUDA),
    HELPER(cuStreamIsCapturing, LIB_CUDA), HELPER(cuStreamIsCapturing_ptsz, LIB_CUDA),
    HELPER(nvmlDeviceGetUUID, LIB_NVML), HELPER(nvmlDeviceGetIndex, LIB_NVML),
    HELPER(nvmlDeviceGetCount_v2, LIB_NVML), HELPER(nvmlDeviceGetHandleByIndex_v2, LIB_NVML),
    HELPER(cuCtxGetCurrent, LIB_CUDA), HELPER(cuDeviceGetAttribute, LIB_CUDA),
    HELPER(cuCtxGetExecAffinity, LIB_CUDA),
};
#define NHOOKS (sizeof hooks / sizeof hooks[0])

/* older drivers name some helpers without the version suffix */
static const char *fallback_name(const char *name)
{
    if (strcmp(name, "cuDeviceGetUuid_v2") == 0) return "cuDeviceGetUuid";
    if (strcmp(name, "cuEventElapsedTime_v2") == 0) return "cuEventElapsedTime";
    if (strcmp(name, "cuEventRecord_ptsz") == 0) return "cuEventRecord";
    if (strcmp(name, "cuStreamIsCapturing_ptsz") == 0) return "cuStreamIsCapturing";
    return NULL;
}

/* What a missing real function does: the driver is absent or too old for that entry point.
 * Called through the hooked prototypes; every one returns an int status in rax. */
static int missing_cuda(void) { return CUDA_ERROR_NOT_INITIALIZED; }
static int missing_nvml(void) { return NVML_ERROR_LIBRARY_NOT_FOUND; }

/* ------------------------------------------------------------------ state */

#define COST_ENTRIES 256 /* launch costs remembered per GPU: direct-mapped by kernel/graph */

struct gpu_state {
    int index;                 /* limit slot i */
    int failed;                /* fail closed: every allocation refused, 0 reported */
    uint64_t limit;
    int compute, burst;
    int mps;                   /* sharingStrategy MPS: launches cost their context's SMs (mps_scale) */
    uint32_t sm_count;         /* the GPU's SMs, from the limits file; 0 = unknown */
    CUcontext mps_ctx;         /* the context whose part of the SMs mps_ppm is; NULL = none yet */
    uint64_t mps_ppm;
    struct gs_region region;
    const struct gs_control *control; /* the agent's trusted rate and slot; NULL = none */
    /* pacing: cost of a launch (GPU ns) measured with an event pair every SAMPLE_NS */
    uint64_t cost_ns[2];       /* [kernel, graph]: mean of all samples, 0 = unknown */
    struct cost_entry { uintptr_t key; uint64_t ns; } costs[COST_ENTRIES]; /* per kernel/graph */
    uint64_t my_tat_ns;        /* this process's own bucket (the region's can be forged) */
    uint64_t my_shared_ns;     /* what this process last wrote into the region's timeline */
    int forged;                /* the region's timeline went back: paced alone at rate / procs */
    uint64_t next_sample_ns;
    pthread_mutex_t sample_lock; /* only trylocked on the launch path */
    int pending, pending_kind;
    int pending_upper;         /* the GPU was idle at the launch: the sample also counts our
                                  own launch gap, so it may only lower the estimate */
    uintptr_t pending_key;
    CUevent ev0, ev1;
};

static struct gs_limits g_limits;
static struct gpu_state g_gpu[GS_MAX_GPUS];
static int g_gpu_open[GS_MAX_GPUS];
static struct gpu_state g_failclosed = {.index = -1, .failed = 1};
static struct gpu_state g_unmanaged; /* sentinel: device not under the claim */
#define MAX_DEV 64
static struct gpu_state *g_cuda_map[MAX_DEV], *g_nvml_map[MAX_DEV];
static pthread_mutex_t g_map_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gs_ptrmap g_ptrs = GS_PTRMAP_INIT;
static int g_fault_stop;

enum { LAUNCH_UNREADY = 0, LAUNCH_PASS, LAUNCH_PACE };
static int g_launch_mode;      /* the single branch a launch takes when nothing is paced */
static int g_cuda_ready, g_nvml_ready;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_nvml_once = PTHREAD_ONCE_INIT;

static void atfork_prepare(void)
{
    pthread_mutex_lock(&g_map_lock);
    pthread_mutex_lock(&g_ptrs.lock);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&g_ptrs.lock);
    pthread_mutex_unlock(&g_map_lock);
}

/* The child owns none of the parent's device memory: it gets its own usage slots (taken
 * on its first allocation) and an empty pointer table. */
static void atfork_child(void)
{
    pthread_mutex_unlock(&g_ptrs.lock);
    gs_ptrmap_reset_child(&g_ptrs);
    pthread_mutex_init(&g_map_lock, NULL);
    for (int i = 0; i < GS_MAX_GPUS; i++) {
        if (!g_gpu_open[i]) continue;
        struct gpu_state *g = &g_gpu[i];
        if (!g->failed) gs_region_forget_slot(&g->region);
        pthread_mutex_init(&g->sample_lock, NULL);
        g->pending = 0;
        g->my_tat_ns = 0;
        g->my_shared_ns = 0;
        g->mps_ctx = NULL;
        g->ev0 = g->ev1 = NULL; /* events of the parent's contexts */
    }
}

/* Under a C library other than glibc (musl) the library passes every call through: the usage
 * region's mutexes are glibc's, so a musl process could not take part in the claim's shared
 * budget safely. The node's backstop still holds the claim's memory (docs/images.md). Said once
 * per process, at its first driver call, so programs that never touch the GPU print nothing. */
static void say_inactive(void)
{
    static int said;
    if (__atomic_exchange_n(&said, 1, __ATOMIC_ACQ_REL)) return;
    gs_log("the claim's library is not active in this program (its C library is not glibc): the node "
           "still holds the claim's memory limit; compute is not paced and memory queries show the whole GPU");
}

static void init_once(void)
{
    if (!gs_libc_is_glibc()) {
        say_inactive(); /* g_limits stays GS_MODE_NONE: everything passes through */
        return;
    }
    gs_limits_load(&g_limits);
    if (g_limits.mode == GS_MODE_RUN_DIR) { /* test-only fault hooks, never in a container */
        const char *f = getenv("GPUSHARE_TEST_FAULT");
        g_fault_stop = f && strcmp(f, "stop_in_lock") == 0;
    }
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static void resolve(int lib, const char *soname)
{
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; i < NHOOKS; i++) {
        if (hooks[i].lib != lib) continue;
        void *p = h ? gs_real_dlsym()(h, hooks[i].name) : NULL;
        const char *alt = fallback_name(hooks[i].name);
        if (!p && h && alt) p = gs_real_dlsym()(h, alt);
        if (!p) p = lib == LIB_CUDA ? (void *)missing_cuda : (void *)missing_nvml;
        __atomic_store_n(hooks[i].real, p, __ATOMIC_RELEASE);
    }
}

static void resolve_cuda(void)
{
    resolve(LIB_CUDA, "libcuda.so.1");
    int pace = 0;
    if (g_limits.mode != GS_MODE_NONE && !g_limits.failed)
        for (int i = 0; i < g_limits.count; i++) pace |= g_limits.gpu[i].compute < 100;
    __atomic_store_n(&g_launch_mode, pace ? LAUNCH_PACE : LAUNCH_PASS, __ATOMIC_RELEASE);
    __atomic_store_n(&g_cuda_ready, 1, __ATOMIC_RELEASE);
}

static void resolve_nvml(void)
{
    resolve(LIB_NVML, "libnvidia-ml.so.1");
    __atomic_store_n(&g_nvml_ready, 1, __ATOMIC_RELEASE);
}

static inline void ensure_cuda(void)
{
    if (LIKELY(__atomic_load_n(&g_cuda_ready, __ATOMIC_ACQUIRE))) return;
    pthread_once(&g_init_once, init_once);
    pthread_once(&g_cuda_once, resolve_cuda);
}

static inline void ensure_nvml(void)
{
    if (LIKELY(__atomic_load_n(&g_nvml_ready, __ATOMIC_ACQUIRE))) return;
    pthread_once(&g_init_once, init_once);
    pthread_once(&g_nvml_once, resolve_nvml);
}

/* ------------------------------------------------------------------ device -> limit slot */

/* The agent's control file of GPU i, mapped read-only. NULL = none: missing (a claim prepared
 * by an older plugin) or unusable. It is root-owned, so a bad one is a bug, not an attack:
 * one log line, and pacing falls back to the region's rate and the limit. All zeros is fine
 * (the agent has not written it yet); the header is checked again with every rate read. */
static const struct gs_control *open_control(int i)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/control/%d", g_limits.dir, i);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) gs_log("cannot open control file %s: %s; ignored", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    void *p = MAP_FAILED;
    if (gs_fstat(fd, &st) != 0 || st.st_size != GS_CONTROL_SIZE)
        gs_log("control file %s has size %lld, expected %u; ignored", path, (long long)st.st_size,
               GS_CONTROL_SIZE);
    else if ((p = mmap(NULL, GS_CONTROL_SIZE, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
        gs_log("cannot map control file %s: %s; ignored", path, strerror(errno));
    close(fd); /* the mapping keeps the file */
    if (p == MAP_FAILED) return NULL;
    const struct gs_control *c = p;
    uint64_t magic = __atomic_load_n(&c->magic, __ATOMIC_ACQUIRE);
    if (magic != 0 && (magic != GS_CONTROL_MAGIC || c->version != GS_CONTROL_VERSION)) {
        gs_log("control file %s has magic %#llx version %u, expected %#llx version %u; ignored", path,
               (unsigned long long)magic, c->version, (unsigned long long)GS_CONTROL_MAGIC, GS_CONTROL_VERSION);
        munmap(p, GS_CONTROL_SIZE);
        return NULL;
    }
    return c;
}

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
    char path[4200];
    snprintf(path, sizeof path, "%s/region/%d", g_limits.dir, i);
    g->failed = gs_region_open(&g->region, g_limits.mode == GS_MODE_ENV ? NULL : path) != 0;
    g->region.fault_stop = g_fault_stop;
    if (g_limits.mode != GS_MODE_ENV && !g->failed && g->compute < 100) /* only pacing reads it */
        g->control = open_control(i);
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

static struct gpu_state *gpu_for_device(CUdevice dev)
{
    ensure_cuda();
    if (g_limits.mode == GS_MODE_NONE) return NULL;
    return lookup(g_cuda_map, dev, find_cuda);
}

/* the device of the calling thread's current context: where cuMemAlloc & co allocate */
static struct gpu_state *current_gpu(void)
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

static struct gpu_state *gpu_for_nvml(nvmlDevice_t d)
{
    unsigned int idx;
    if (g_limits.mode == GS_MODE_NONE || real_nvmlDeviceGetIndex(d, &idx) != NVML_SUCCESS) return NULL;
    return lookup(g_nvml_map, (int)idx, find_nvml);
}

/* ------------------------------------------------------------------ memory accounting */

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

/* Forget the entry before the real free (the driver may hand the address out again at
 * once), and put it back if the free fails. */
static int untrack(int kind, uint64_t key, struct gs_ptr_entry *e)
{
    ensure_cuda();
    return g_limits.mode != GS_MODE_NONE && !g_limits.failed && gs_ptrmap_take(&g_ptrs, kind, key, e);
}

static CUresult finish_free(CUresult rc, int known, const struct gs_ptr_entry *e)
{
    if (!known) return rc;
    if (rc == CUDA_SUCCESS) release(&g_gpu[e->gpu], e->size);
    else gs_ptrmap_put(&g_ptrs, e->kind, e->key, e->size, e->gpu);
    return rc;
}

#define ALLOC_BODY(g, size, kind, keyexpr, call)                                             \
    do {                                                                                     \
        if (!(g) || (size) == 0) return call;                                                \
        if (reserve((g), (size)) != 0) return CUDA_ERROR_OUT_OF_MEMORY;                      \
        CUresult rc_ = call;                                                                 \
        return track((g), rc_, (kind), rc_ == CUDA_SUCCESS ? (uint64_t)(keyexpr) : 0, (size)); \
    } while (0)

#define FREE_BODY(kind, key, call)                                                           \
    do {                                                                                     \
        struct gs_ptr_entry e_;                                                              \
        int known_ = untrack((kind), (uint64_t)(key), &e_);                                  \
        return finish_free(call, known_, &e_);                                               \
    } while (0)

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

/* 1 if stream s is capturing, or the driver says it may not be used now (the legacy stream
 * while a blocking stream captures): pacing never touches it, and memory allocated on it would
 * be graph memory */
static int capturing(CUstream s, int ptsz)
{
    __typeof__(real_cuStreamIsCapturing) fn = ptsz ? real_cuStreamIsCapturing_ptsz : real_cuStreamIsCapturing;
    if ((void *)fn == (void *)missing_cuda) return 0; /* a driver without capture */
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return fn(s, &st) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_NONE;
}

HOOK CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    struct gpu_state *g = current_gpu();
    ALLOC_BODY(g, size, GS_KIND_PTR, *dptr, real_cuMemAlloc_v2(dptr, size));
}

HOOK CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    struct gpu_state *g = current_gpu();
    ALLOC_BODY(g, size, GS_KIND_PTR, *dptr, real_cuMemAllocManaged(dptr, size, flags));
}

/* Stream-ordered allocations count when enqueued (against the current context's device).
 * On a capturing stream they would become graph memory nodes: refused (graph_memory_refused). */
HOOK CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s)
{
    struct gpu_state *g = current_gpu();
    if (g && capturing(s, 0)) return graph_memory_refused("cuMemAllocAsync on a capturing stream");
    ALLOC_BODY(g, size, GS_KIND_PTR, *dptr, real_cuMemAllocAsync(dptr, size, s));
}

HOOK CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s)
{
    struct gpu_state *g = current_gpu();
    if (g && capturing(s, 1)) return graph_memory_refused("cuMemAllocAsync on a capturing stream");
    ALLOC_BODY(g, size, GS_KIND_PTR, *dptr, real_cuMemAllocAsync_ptsz(dptr, size, s));
}

HOOK CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{
    struct gpu_state *g = current_gpu();
    if (g && capturing(s, 0)) return graph_memory_refused("cuMemAllocFromPoolAsync on a capturing stream");
    ALLOC_BODY(g, size, GS_KIND_PTR, *dptr, real_cuMemAllocFromPoolAsync(dptr, size, pool, s));
}

HOOK CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{
    struct gpu_state *g = current_gpu();
    if (g && capturing(s, 1)) return graph_memory_refused("cuMemAllocFromPoolAsync on a capturing stream");
    ALLOC_BODY(g, size, GS_KIND_PTR, *dptr, real_cuMemAllocFromPoolAsync_ptsz(dptr, size, pool, s));
}

HOOK CUresult cuMemFree_v2(CUdeviceptr p) { FREE_BODY(GS_KIND_PTR, p, real_cuMemFree_v2(p)); }

HOOK CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    FREE_BODY(GS_KIND_PTR, p, real_cuMemFreeAsync(p, s));
}

HOOK CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    FREE_BODY(GS_KIND_PTR, p, real_cuMemFreeAsync_ptsz(p, s));
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

/* VMM: only device locations count; host memory passes through. */
HOOK CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                          unsigned long long flags)
{
    int dev = prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
    struct gpu_state *g = dev >= 0 ? gpu_for_device(dev) : (ensure_cuda(), NULL);
    ALLOC_BODY(g, size, GS_KIND_VMM, *h, real_cuMemCreate(h, size, prop, flags));
}

HOOK CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    struct gpu_state *g = current_gpu();
    size_t size = d ? gs_array_bytes(d) : 0;
    ALLOC_BODY(g, size, GS_KIND_ARRAY, (uintptr_t)*a, real_cuArrayCreate_v2(a, d));
}

HOOK CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    struct gpu_state *g = current_gpu();
    size_t size = d ? gs_array3d_bytes(d, 1) : 0;
    ALLOC_BODY(g, size, GS_KIND_ARRAY, (uintptr_t)*a, real_cuArray3DCreate_v2(a, d));
}

HOOK CUresult cuArrayDestroy(CUarray a)
{
    FREE_BODY(GS_KIND_ARRAY, (uintptr_t)a, real_cuArrayDestroy(a));
}

HOOK CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                     unsigned int levels)
{
    struct gpu_state *g = current_gpu();
    size_t size = d ? gs_array3d_bytes(d, levels) : 0;
    ALLOC_BODY(g, size, GS_KIND_MIPMAP, (uintptr_t)*m, real_cuMipmappedArrayCreate(m, d, levels));
}

HOOK CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
    FREE_BODY(GS_KIND_MIPMAP, (uintptr_t)m, real_cuMipmappedArrayDestroy(m));
}

/* ------------------------------------------------------------------ other device-memory paths
 * (hook/README.md lists every path with its status) */

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

/* VMM: the driver frees a handle's memory when it is released *and* unmapped. A counted handle
 * carries its number of mappings; released while mapped, it stays counted (as
 * GS_KIND_VMM_RELEASED) until its last mapping goes. */
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

/* Context limits that reserve device memory beyond what the context starts with: the
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

HOOK CUresult cuCtxDestroy_v2(CUcontext c)
{
    ensure_cuda();
    CUresult rc = real_cuCtxDestroy_v2(c);
    for (int i = 0; rc == CUDA_SUCCESS && i < GS_MAX_GPUS; i++) /* a new context may get its address */
        if (g_gpu_open[i]) __atomic_store_n(&g_gpu[i].mps_ctx, NULL, __ATOMIC_RELEASE);
    struct gs_ptr_entry e;
    for (int limit = 0; rc == CUDA_SUCCESS && limit <= CU_LIMIT_MALLOC_HEAP_SIZE; limit++)
        if (gs_ptrmap_take(&g_ptrs, GS_KIND_CTX_LIMIT, ctx_limit_key(c, limit), &e)) release(&g_gpu[e.gpu], e.size);
    return rc;
}

/* ------------------------------------------------------------------ reporting */

/* total = min(limit, physical); free = total - claim usage (>= 0, <= physical free) */
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

/* ------------------------------------------------------------------ compute pacing
 * Design, alternatives and figures: docs/compute.md. Contexts of different processes are
 * time-sliced, so an event pair around a kernel also counts the slices of the other claims'
 * contexts: a cost measured that way says little while others are busy. So:
 *  - each launch books cost/rate of the claim's timeline in a GCRA token bucket: pace_tat_ns
 *    in the region, shared by the claim's processes, and a private one per process, so that
 *    a forged region can never let a process run past the rate on its own;
 *  - the node agent gives each claim on a GPU its own time slot in a common period (control
 *    file, trusted). Inside its slot a claim may run up to a period ahead of its timeline, so
 *    a busy claim launches its period's worth there and the claims take turns: each runs
 *    alone and measures its own cost. Outside its slot it may run OUT_BURST_NS ahead, so a
 *    claim that uses less than its rate is never held back;
 *  - cost = per kernel (function and grid) or graph: the low envelope of event-pair samples,
 *    which drops to a clean sample at once and rises by 1/32 of an inflated one (at most
 *    1/32 of itself);
 *  - nothing is recorded, queried, synchronised or slept on a capturing stream, and no event
 *    is queried or synchronised while a capture is active in the process (global-mode
 *    capture forbids it on every stream).
 * Without a slot (no agent, older plugin) the bucket may run BURST_NS ahead anywhere. */

#define BURST_NS 10000000ull      /* no slot: 10 ms */
#define OUT_BURST_NS 2000000ull   /* outside the claim's slot: 2 ms */
#define SAMPLE_NS 10000000ull     /* one measured launch per 10 ms */
#define TAT_SANE_NS 10000000000ull /* a timeline further ahead is forged: ignored */
enum { KIND_KERNEL = 0, KIND_GRAPH = 1 };

static int g_captures; /* captures begun through us and not yet ended */

struct launch {
    struct gpu_state *g;  /* NULL: not paced */
    int kind, ptsz, sampling;
    uintptr_t key;
    CUstream stream;
};

static uint64_t rate_ppm(struct gpu_state *g)
{
    /* Trusted (root-owned, read-only in the container), so it may exceed the limit: the agent
     * raises a Burst claim's rate into idle time. */
    uint64_t trusted = g->control ? gs_control_rate(g->control) : 0;
    if (trusted) return trusted > 1000000 ? 1000000 : trusted;
    uint64_t limit = (uint64_t)g->compute * 10000;
    uint64_t agent = __atomic_load_n(&g->region.hdr->pace_rate_ppm, __ATOMIC_RELAXED);
    if (agent == 0 || (!g->burst && agent > limit)) return limit;
    return agent > 1000000 ? 1000000 : agent;
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

static CUresult record(CUevent e, CUstream s, int ptsz)
{
    return ptsz ? real_cuEventRecord_ptsz(e, s) : real_cuEventRecord(e, s);
}


static struct cost_entry *cost_entry(struct gpu_state *g, uintptr_t key)
{
    return &g->costs[((key >> 4) ^ (key >> 14)) % COST_ENTRIES];
}

/* the launch's cost: its own entry, else the mean of the kind; 0 = never measured. (Key and
 * ns are two loads: a racing update may charge one launch another's cost.) */
static uint64_t cost_of(struct gpu_state *g, int kind, uintptr_t key)
{
    struct cost_entry *e = cost_entry(g, key);
    uint64_t ns = __atomic_load_n(&e->key, __ATOMIC_RELAXED) == key ? __atomic_load_n(&e->ns, __ATOMIC_RELAXED) : 0;
    return ns ? ns : __atomic_load_n(&g->cost_ns[kind], __ATOMIC_RELAXED);
}

/* under sample_lock: read a finished sample into the cost estimates */
static void finish_sample(struct gpu_state *g)
{
    CUresult q = real_cuEventQuery(g->ev1);
    if (q == CUDA_ERROR_NOT_READY) return;
    float ms = 0;
    g->pending = 0;
    if (q != CUDA_SUCCESS || real_cuEventElapsedTime_v2(&ms, g->ev0, g->ev1) != CUDA_SUCCESS) return;
    /* +1: a measured cost is never 0, so 0 keeps meaning "not measured yet" */
    uint64_t sample = (ms > 0 ? (uint64_t)((double)ms * 1e6) : 0) + 1;
    uint64_t *c = &g->cost_ns[g->pending_kind];
    uint64_t old = __atomic_load_n(c, __ATOMIC_RELAXED);
    __atomic_store_n(c, old ? (3 * old + sample) / 4 : sample, __ATOMIC_RELAXED);
    struct cost_entry *e = cost_entry(g, g->pending_key);
    old = e->key == g->pending_key ? e->ns : 0;
    uint64_t rise = (sample - old) / 32 < old / 32 ? (sample - old) / 32 : old / 32; /* one slice is no trend */
    if (g->pending_upper) rise = 0;
    __atomic_store_n(&e->ns, !old || sample < old ? sample : old + rise, __ATOMIC_RELAXED);
    __atomic_store_n(&e->key, g->pending_key, __ATOMIC_RELAXED);
}

/* GCRA: book interval on timeline *tat, not starting before floor (<= now); returns the time
 * the booking starts at */
static uint64_t book(uint64_t *tat, uint64_t now, uint64_t floor, uint64_t interval)
{
    uint64_t old = __atomic_load_n(tat, __ATOMIC_RELAXED), base;
    do { /* ignore an absurd timeline (the region is tenant-writable) */
        base = old > floor && old < now + TAT_SANE_NS ? old : floor;
    } while (!__atomic_compare_exchange_n(tat, &old, base + interval, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return base;
}

/* The claim's shared timeline (the region's pace_tat_ns) only ever moves forward: every booking
 * writes max(old, floor) + interval. So a value below the one this process last wrote there, or
 * an absurd one, means someone wrote the region: a tenant that keeps it at 0 lets each of its
 * processes run at the claim's whole rate on its private bucket, N processes N times the share
 * (issue 26). From then on this process paces its private bucket at rate / procs, procs being
 * the agent's count of the claim's processes on the GPU (trusted control file): together they
 * hold the claim's rate whatever the region says. Sticky for the process's life. */
static uint64_t book_shared(struct gpu_state *g, uint64_t now, uint64_t floor, uint64_t interval)
{
    uint64_t *tat = &g->region.hdr->pace_tat_ns;
    /* last before old (acquire/release): another thread's write is in the timeline before its
     * my_shared_ns, so an honest timeline is never seen below it */
    uint64_t last = __atomic_load_n(&g->my_shared_ns, __ATOMIC_ACQUIRE);
    uint64_t old = __atomic_load_n(tat, __ATOMIC_RELAXED), base;
    do {
        if ((old < last || old >= now + TAT_SANE_NS) && !__atomic_exchange_n(&g->forged, 1, __ATOMIC_RELAXED))
            gs_log("GPU %d: the claim's pacing timeline in the usage region went back (%llu ns, this process wrote "
                   "%llu): a process of the claim writes the region; this process now paces itself at the claim's "
                   "rate / %u (the processes the node agent sees)", g->index, (unsigned long long)old,
                   (unsigned long long)last, g->control ? gs_control_procs(g->control) : 1u);
        base = old > floor && old < now + TAT_SANE_NS ? old : floor;
    } while (!__atomic_compare_exchange_n(tat, &old, base + interval, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    __atomic_store_n(&g->my_shared_ns, base + interval, __ATOMIC_RELEASE);
    return base;
}

/* MPS (docs/strategies.md): kernels of the MPS server's clients run side by side, each on the
 * SMs the server gives its context, so a launch costs its GPU time times that part of the SMs:
 * an MPS claim's timeline counts SM-time. A lone client the server holds to the share then books
 * exactly its rate and never waits; several processes of one claim, or a client at a larger
 * claim's ceiling (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE unset or raised), are held to the share
 * together. What a context may use is asked of the driver, never read from the environment the
 * tenant writes: only an MPS context has an SM limit (cuCtxGetExecAffinity). A plain context (the
 * pipe folder dropped or pointed elsewhere), an unknown SM count (limits file) or a driver before
 * CUDA 11.4 costs the whole GPU, as under TimeSlicing. One answer per context, kept until another
 * context launches or it is destroyed. */
#define MPS_SM_SLACK 2u /* SMs of a TPC: the driver rounds an SM limit up to whole TPCs (cuda.h) */

static uint64_t mps_scale(struct gpu_state *g)
{
    CUcontext ctx = NULL;
    if (real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return 1000000;
    if (__atomic_load_n(&g->mps_ctx, __ATOMIC_ACQUIRE) == ctx) return __atomic_load_n(&g->mps_ppm, __ATOMIC_RELAXED);
    CUexecAffinityParam a = {0};
    CUresult rc = g->sm_count ? real_cuCtxGetExecAffinity(&a, CU_EXEC_AFFINITY_TYPE_SM_COUNT) : CUDA_ERROR_NOT_SUPPORTED;
    uint64_t sms = a.param.smCount.val, ppm = 1000000; /* no answer: the whole GPU */
    if (rc == CUDA_SUCCESS && sms * 100 <= (uint64_t)g->sm_count * (uint64_t)g->compute + MPS_SM_SLACK * 100)
        ppm = (uint64_t)g->compute * 10000; /* the driver's rounding up to a whole TPC is not the tenant's */
    else if (rc == CUDA_SUCCESS && sms < g->sm_count)
        ppm = sms * 1000000 / g->sm_count;
    __atomic_store_n(&g->mps_ppm, ppm, __ATOMIC_RELAXED); /* a racing reader may take one launch at another's */
    __atomic_store_n(&g->mps_ctx, ctx, __ATOMIC_RELEASE);
    static int said;
    if (rc != CUDA_SUCCESS && !__atomic_exchange_n(&said, 1, __ATOMIC_ACQ_REL)) {
        if (!g->sm_count)
            gs_log("MPS claim: the limits file does not give the GPU's SM count; a launch costs its time on the whole "
                   "GPU (paced as under TimeSlicing)");
        else
            gs_log("MPS claim: this process is no MPS client of the claim's server (cuCtxGetExecAffinity: %d); "
                   "paced to the %d %% share as under TimeSlicing", rc, g->compute);
    }
    return ppm;
}

static void pace_begin(struct launch *L, CUstream s, int ptsz, int kind, uintptr_t key)
{
    L->g = NULL;
    L->sampling = 0;
    ensure_cuda();
    if (g_launch_mode != LAUNCH_PACE) return;
    struct gpu_state *g = current_gpu();
    if (!g || g->failed || g->compute >= 100) return;
    int captures = __atomic_load_n(&g_captures, __ATOMIC_RELAXED) > 0;
    if (captures && capturing(s, ptsz)) return; /* it goes into a graph: nothing runs now */
    L->g = g;
    L->kind = kind;
    L->ptsz = ptsz;
    L->stream = s;
    L->key = key;

    uint64_t now = gs_now_ns();
    uint64_t cost = cost_of(g, kind, key);
    if (g->mps && cost) cost = cost * mps_scale(g) / 1000000 + 1; /* SM-time; never 0 (= not measured) */
    int first_in_slot = 0;
    if (cost) {
        uint64_t start = 0, len = 0, period = 0, ahead = BURST_NS, next_slot = 0;
        int slotted = g->control && gs_control_slot(g->control, &start, &len, &period);
        int in_slot = 0;
        uint64_t floor = now;
        if (slotted) { /* in the slot: up to the next slot's start, a period's worth */
            uint64_t phase = (now % period + period - start) % period; /* since the slot began */
            in_slot = phase < len;
            next_slot = now + period - phase;
            ahead = in_slot ? period - phase : OUT_BURST_NS;
            if (in_slot) floor = now - phase; /* a late wake-up does not cost the claim its time */
        }
        uint64_t interval = cost * 1000000 / rate_ppm(g);
        uint64_t base = book_shared(g, now, floor, interval);
        int forged = __atomic_load_n(&g->forged, __ATOMIC_RELAXED);
        uint64_t alone = forged && g->control ? gs_control_procs(g->control) : 1;
        /* forged: a GCRA of its own that may catch up a period it lost waiting for its slot */
        uint64_t tolerance = slotted ? period : BURST_NS;
        uint64_t mine = book(&g->my_tat_ns, now, forged && now > tolerance ? now - tolerance : floor, interval * alone);
        if (mine > base) base = mine;
        /* the first launch of a slot can queue behind the last one of the previous slot's
         * claim: not a clean sample */
        first_in_slot = in_slot && base <= now;
        __atomic_add_fetch(&g->region.hdr->pace_gpu_ns, cost, __ATOMIC_RELAXED);
        if (base > now + ahead) {
            /* slotted: at the latest when a slot opens in which the booking fits (a period's worth
             * from its start). Waking at the next slot whatever was booked let each waiting process
             * launch once a period: a claim's processes together, or one whose launch costs more
             * than a period of its rate, took more than the share (4 MPS clients of a 25 % claim:
             * 46 % of the work beside a neighbour) */
            uint64_t wake = base - ahead;
            if (slotted) {
                uint64_t opens = next_slot;
                if (base > opens + period) opens += (base - opens - period + period - 1) / period * period;
                if (in_slot || opens < wake) wake = opens;
            }
            __atomic_add_fetch(&g->region.hdr->paced_ns, wake - now, __ATOMIC_RELAXED);
            sleep_until(wake);
            now = wake;
        }
        if (forged) { /* the private bucket alone holds the claim: a plain GCRA, no slot shortcut */
            if (mine > now + tolerance) {
                uint64_t wake = mine - tolerance;
                if (slotted) { /* in the claim's slot, as its other launches (clean cost samples) */
                    uint64_t phase = (wake % period + period - start) % period;
                    if (phase >= len) wake += period - phase;
                }
                __atomic_add_fetch(&g->region.hdr->paced_ns, wake - now, __ATOMIC_RELAXED);
                sleep_until(wake);
                now = wake;
            }
        }
    }
    if (captures || first_in_slot || (cost && now < __atomic_load_n(&g->next_sample_ns, __ATOMIC_RELAXED)) ||
        pthread_mutex_trylock(&g->sample_lock) != 0)
        return;
    if (g->pending) finish_sample(g);
    if (!g->pending && (!g->ev0 || !g->ev1)) {
        if (real_cuEventCreate(&g->ev0, CU_EVENT_DEFAULT) != CUDA_SUCCESS) g->ev0 = NULL;
        if (real_cuEventCreate(&g->ev1, CU_EVENT_DEFAULT) != CUDA_SUCCESS) g->ev1 = NULL;
    }
    /* capturing() again: a capture begun where we cannot see it (cuStreamBeginCaptureToGraph) */
    if (!g->pending && g->ev0 && g->ev1 && !capturing(s, ptsz) && record(g->ev0, s, ptsz) == CUDA_SUCCESS) {
        L->sampling = 1; /* keep sample_lock until pace_end */
        return;
    }
    __atomic_store_n(&g->next_sample_ns, now + SAMPLE_NS, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g->sample_lock);
}

static void pace_end(struct launch *L, CUresult rc)
{
    if (!L->sampling) return;
    struct gpu_state *g = L->g;
    if (rc == CUDA_SUCCESS && record(g->ev1, L->stream, L->ptsz) == CUDA_SUCCESS) {
        g->pending = 1;
        g->pending_kind = L->kind;
        g->pending_key = L->key;
        g->pending_upper = !__atomic_load_n(&g_captures, __ATOMIC_RELAXED) && real_cuEventQuery(g->ev0) == CUDA_SUCCESS;
        if (!__atomic_load_n(&g->cost_ns[L->kind], __ATOMIC_RELAXED) &&
            !__atomic_load_n(&g_captures, __ATOMIC_RELAXED)) { /* first: wait for it */
            real_cuEventSynchronize(g->ev1);
            finish_sample(g);
        }
    } else if (rc == CUDA_SUCCESS) { /* events of another context: make new ones next time */
        real_cuEventDestroy_v2(g->ev0);
        real_cuEventDestroy_v2(g->ev1);
        g->ev0 = g->ev1 = NULL;
    }
    __atomic_store_n(&g->next_sample_ns, gs_now_ns() + SAMPLE_NS, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g->sample_lock);
}

#define LAUNCH(realfn, stream, ptsz, kind, key, ...)                                         \
    do {                                                                                     \
        if (LIKELY(__atomic_load_n(&g_launch_mode, __ATOMIC_ACQUIRE) == LAUNCH_PASS))        \
            return realfn(__VA_ARGS__);                                                      \
        struct launch L_;                                                                    \
        pace_begin(&L_, (stream), (ptsz), (kind), (key));                                    \
        CUresult rc_ = realfn(__VA_ARGS__);                                                  \
        pace_end(&L_, rc_);                                                                  \
        return rc_;                                                                          \
    } while (0)

/* a kernel's cost key: the function and its grid size */
#define KEY(f, gx, gy, gz) ((uintptr_t)(f) ^ ((uintptr_t)(gx) * (gy) * (gz) << 20))

HOOK CUresult cuLaunchKernel(GS_LAUNCH_ARGS, void **extra)
{
    LAUNCH(real_cuLaunchKernel, s, 0, KIND_KERNEL, KEY(f, gx, gy, gz), f, gx, gy, gz, bx, by, bz, shmem, s,
           params, extra);
}

HOOK CUresult cuLaunchKernel_ptsz(GS_LAUNCH_ARGS, void **extra)
{
    LAUNCH(real_cuLaunchKernel_ptsz, s, 1, KIND_KERNEL, KEY(f, gx, gy, gz), f, gx, gy, gz, bx, by, bz, shmem,
           s, params, extra);
}

HOOK CUresult cuLaunchCooperativeKernel(GS_LAUNCH_ARGS)
{
    LAUNCH(real_cuLaunchCooperativeKernel, s, 0, KIND_KERNEL, KEY(f, gx, gy, gz), f, gx, gy, gz, bx, by, bz,
           shmem, s, params);
}

HOOK CUresult cuLaunchCooperativeKernel_ptsz(GS_LAUNCH_ARGS)
{
    LAUNCH(real_cuLaunchCooperativeKernel_ptsz, s, 1, KIND_KERNEL, KEY(f, gx, gy, gz), f, gx, gy, gz, bx, by,
           bz, shmem, s, params);
}

#define EX_KEY(cfg, f) (cfg ? KEY(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ) : (uintptr_t)(f))

HOOK CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    LAUNCH(real_cuLaunchKernelEx, cfg ? cfg->hStream : NULL, 0, KIND_KERNEL, EX_KEY(cfg, f), cfg, f, params,
           extra);
}

HOOK CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    LAUNCH(real_cuLaunchKernelEx_ptsz, cfg ? cfg->hStream : NULL, 1, KIND_KERNEL, EX_KEY(cfg, f), cfg, f,
           params, extra);
}

/* a graph launch is charged at the graph's own measured replay cost */
HOOK CUresult cuGraphLaunch(CUgraphExec ge, CUstream s)
{
    LAUNCH(real_cuGraphLaunch, s, 0, KIND_GRAPH, (uintptr_t)ge, ge, s);
}

HOOK CUresult cuGraphLaunch_ptsz(CUgraphExec ge, CUstream s)
{
    LAUNCH(real_cuGraphLaunch_ptsz, s, 1, KIND_GRAPH, (uintptr_t)ge, ge, s);
}

/* Captures: counted so that the launch path asks the driver about capture only while one
 * is active. An ended capture (invalidated or not) is no longer active. */
static CUresult capture_begun(CUresult rc)
{
    if (rc == CUDA_SUCCESS) __atomic_add_fetch(&g_captures, 1, __ATOMIC_RELAXED);
    return rc;
}

static CUresult capture_ended(CUresult rc)
{
    int n = __atomic_load_n(&g_captures, __ATOMIC_RELAXED);
    if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        while (n > 0 && !__atomic_compare_exchange_n(&g_captures, &n, n - 1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return rc;
}

HOOK CUresult cuStreamBeginCapture(CUstream s) { ensure_cuda(); return capture_begun(real_cuStreamBeginCapture(s)); }
HOOK CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
    ensure_cuda();
    return capture_begun(real_cuStreamBeginCapture_ptsz(s));
}
HOOK CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m)
{
    ensure_cuda();
    return capture_begun(real_cuStreamBeginCapture_v2(s, m));
}
HOOK CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m)
{
    ensure_cuda();
    return capture_begun(real_cuStreamBeginCapture_v2_ptsz(s, m));
}
HOOK CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { ensure_cuda(); return capture_ended(real_cuStreamEndCapture(s, g)); }
HOOK CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
    ensure_cuda();
    return capture_ended(real_cuStreamEndCapture_ptsz(s, g));
}

/* ------------------------------------------------------------------ symbol lookup */

NO_SANITIZE static const struct hook *find_hook(const char *name)
{
    for (size_t i = 0; i < NHOOKS; i++)
        if (hooks[i].hook && strcmp(hooks[i].name, name) == 0) return &hooks[i];
    return NULL;
}

/* cuGetProcAddress answered pfn for symbol: ours instead, if pfn is a function we hook */
static void *substitute(const char *symbol, void *pfn, int version, cuuint64_t flags)
{
    for (size_t i = 0; i < NHOOKS; i++)
        if (hooks[i].hook && hooks[i].lib == LIB_CUDA && *hooks[i].real == pfn) return hooks[i].hook;
    /* a driver may answer with an internal address: decide by name and version instead */
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, has_ptsz = 0;
    for (size_t i = 0; i < NHOOKS; i++)
        if (hooks[i].hook && hooks[i].ptsz && strcmp(hooks[i].base, symbol) == 0) has_ptsz = 1;
    const struct hook *best = NULL;
    for (size_t i = 0; i < NHOOKS; i++) {
        const struct hook *e = &hooks[i];
        if (!e->hook || e->lib != LIB_CUDA || strcmp(e->base, symbol) != 0) continue;
        if (e->ptsz != (want_ptsz && has_ptsz) || e->min_version > version) continue;
        if (!best || e->min_version > best->min_version) best = e;
    }
    return best ? best->hook : pfn;
}

HOOK CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status)
{
    ensure_cuda();
    CUresult rc = real_cuGetProcAddress_v2(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn) *pfn = substitute(symbol, *pfn, version, flags);
    return rc;
}

HOOK CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    ensure_cuda();
    CUresult rc = real_cuGetProcAddress(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn) *pfn = substitute(symbol, *pfn, version, flags);
    return rc;
}

NO_SANITIZE static int is_driver_object(const char *path, int lib)
{
    const char *b = path ? strrchr(path, '/') : NULL;
    b = b ? b + 1 : path;
    if (!b) return 0;
    return lib == LIB_CUDA ? strncmp(b, "libcuda.so", 10) == 0 : strncmp(b, "libnvidia-ml.so", 15) == 0;
}

/* dlsym(handle, name) where name is a symbol we hook: ours if the real lookup lands in the
 * driver (or already in us). Nothing is initialised here. */
NO_SANITIZE void *gs_hooked_symbol(void *handle, const char *name)
{
    const struct hook *e = find_hook(name);
    if (!e) return NULL;
    if (UNLIKELY(!gs_libc_is_glibc())) {
        say_inactive(); /* the driver's own function, untouched */
        return NULL;
    }
    void *addr = gs_real_dlsym()(handle, name);
    if (!addr || addr == e->hook) return addr;
    Dl_info info;
    if (dladdr(addr, &info) && is_driver_object(info.dli_fname, e->lib)) return e->hook;
    return NULL;
}
