/* Simulated CUDA driver (libcuda.so.1): enough of the driver API for a CUDA application to
 * start, allocate, launch and capture graphs, on simulated devices shared across processes
 * (sim_state.h). Kernels take GPUSHARE_SIM_KERNEL_US of GPU time each (a "spin" kernel: its
 * cycle count at 1 GHz); each process's work runs in order, and the contexts of different
 * processes are time-sliced (sim_sched.c). Launches are asynchronous, synchronisation waits. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/cuda_abi.h"
#include "../src/ptrmap.h"
#include "sim_state.h"

#define QUEUE_KERNELS 1024 /* launches block beyond this many queued kernels, like a real driver */
#define SPIN 8             /* function handle flag: a kernel that spins for params[0] cycles */
#define CLOCK_KHZ 1000000  /* 1 GHz: a cycle is a nanosecond */

struct CUctx_st { int dev; };
/* an event completes when its process's queue reaches pos; t = when (0: not known yet) */
struct CUevent_st { int recorded, dev; uint32_t watch; uint64_t pos, rec_t, t; };
struct CUgraph_st { uint64_t ns; unsigned nodes; };
struct CUgraphExec_st { uint64_t ns; unsigned nodes; };
struct CUstream_st {
    unsigned flags;
    int capturing, invalidated, mode; /* stream capture (see "capture" below) */
    pthread_t thread;                 /* that began the capture */
    uint64_t id;
    struct CUgraph_st *graph;
};

static int g_inited;
static struct CUctx_st g_primary[SIM_MAX_DEV];
static struct gs_ptrmap g_allocs = GS_PTRMAP_INIT;
static uint64_t g_next_handle;
static uint64_t g_nlaunch[SIM_MAX_DEV];                /* launches so far, per device */
static uint64_t g_ends[SIM_MAX_DEV][QUEUE_KERNELS];    /* queue positions of the last ones */
static CUevent g_watch_owner[SIM_MAX_DEV][SIM_WATCHES]; /* the event holding each watch ("events") */
static pthread_mutex_t g_watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_fork_once = PTHREAD_ONCE_INIT;

/* What the driver keeps per thread. A pthread key, not __thread: dynamic TLS would make the
 * library depend on ld-linux-x86-64.so.2 by name (__tls_get_addr), which no other C library
 * has, and the simulated driver must load wherever a client of it does (docs/images.md). */
struct sim_thread {
    CUcontext cur;                /* the current context */
    CUcontext stack[16];          /* cuCtxPushCurrent's */
    int depth;
    struct CUstream_st ptds;      /* the per-thread default stream */
};
static pthread_key_t g_thread_key;
static pthread_once_t g_thread_key_once = PTHREAD_ONCE_INIT;
static void make_thread_key(void) { pthread_key_create(&g_thread_key, free); }

static struct sim_thread *me(void)
{
    pthread_once(&g_thread_key_once, make_thread_key);
    struct sim_thread *t = pthread_getspecific(g_thread_key);
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t || pthread_setspecific(g_thread_key, t) != 0) abort(); /* a simulator out of memory */
    }
    return t;
}

static void fork_child(void)
{
    gs_ptrmap_reset_child(&g_allocs); /* the parent's allocations are not the child's */
    memset(g_nlaunch, 0, sizeof g_nlaunch);
    memset(g_watch_owner, 0, sizeof g_watch_owner); /* the child has a queue of its own */
    pthread_mutex_init(&g_watch_lock, NULL);
}
static void register_fork(void) { pthread_atfork(NULL, NULL, fork_child); }

#define NEED_INIT()                                                   \
    do {                                                              \
        if (!g_inited || sim_open() != 0) return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)
#define NEED_CTX()                                                    \
    do {                                                              \
        NEED_INIT();                                                  \
        if (!me()->cur) return CUDA_ERROR_INVALID_CONTEXT;            \
    } while (0)
/* A CUdevice is the device's ordinal in this process (sim_visible_count, sim_mig.h); d becomes
 * the simulated GPU's index, or the call fails as CUDA's does for an ordinal it does not have */
#define VALID_DEV(d)                                                  \
    do {                                                              \
        if (((d) = physical_of(d)) < 0) return CUDA_ERROR_INVALID_DEVICE; \
    } while (0)

/* CUDA_VISIBLE_DEVICES=MIG-<uuid> of a MIG device NVML made: the process sees that one device,
 * ordinal 0, the parent GPU's CUdevice, with the instance's memory and SMs (sim_mig.h) */
static const struct sim_mig_profile *mig_view(int *dev)
{
    int d, slot;
    if (sim_mig_visible(&d, &slot) != 0) return NULL;
    if (dev) *dev = d;
    return sim_mig_profile_of(d, &sim->mig[d].gi[slot]);
}
static int physical_of(int ordinal)
{
    int mdev;
    if (mig_view(&mdev)) return ordinal == 0 ? mdev : -1;
    return sim_visible_physical(ordinal);
}
static int ordinal_of(int physical)
{
    int mdev;
    if (mig_view(&mdev)) return physical == mdev ? 0 : -1;
    return sim_visible_ordinal(physical);
}

SIM_API CUresult cuInit(unsigned int flags)
{
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (sim_open() != 0) return CUDA_ERROR_NO_DEVICE;
    pthread_once(&g_fork_once, register_fork);
    for (int i = 0; i < SIM_MAX_DEV; i++) g_primary[i].dev = i;
    __atomic_store_n(&g_inited, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDriverGetVersion(int *v)
{
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetCount(int *n)
{
    NEED_INIT();
    *n = mig_view(NULL) ? 1 : (int)sim_visible_count();
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    NEED_INIT();
    if (physical_of(ordinal) < 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    NEED_INIT();
    VALID_DEV(d);
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    strncpy(name, "NVIDIA Simulated GPU", (size_t)len - 1);
    name[len - 1] = 0;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
    NEED_INIT();
    VALID_DEV(d);
    sim_uuid_bytes(d, (unsigned char *)u->bytes);
    return CUDA_SUCCESS;
}

/* v2 gives a MIG device's own UUID (cuda.h: "returns the UUID of the MIG device") */
SIM_API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
    NEED_INIT();
    VALID_DEV(d);
    int mdev, slot;
    if (sim_mig_visible(&mdev, &slot) != 0) return cuDeviceGetUuid(u, d);
    char s[96];
    sim_mig_uuid(mdev, sim->mig[mdev].gi[slot].serial, s, sizeof s);
    sim_uuid_parse(s, (unsigned char *)u->bytes);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
    NEED_INIT();
    VALID_DEV(d);
    const struct sim_mig_profile *mig = mig_view(NULL);
    *bytes = mig ? mig->memory_mib << 20 : sim->dev[d].total;
    return CUDA_SUCCESS;
}

/* The SMs an MPS client may use: its active-thread share of them, rounded up to whole TPCs
 * (2 SMs), as the driver rounds an SM limit "up to the next hardware-supported amount"
 * (cuda.h, cuCtxCreate_v4). */
static int mps_sm_count(void)
{
    uint32_t ppm = sim_me->mps_threads_ppm;
    uint64_t sms = ((uint64_t)ppm * SIM_SM_COUNT + SIM_FULL - 1) / SIM_FULL;
    sms += sms & 1;
    return sms > SIM_SM_COUNT ? SIM_SM_COUNT : (int)sms;
}

SIM_API CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
    NEED_INIT();
    VALID_DEV(d);
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    /* an MPS client sees its share's SMs here, as on real MPS (NVIDIA/k8s-device-plugin#679):
     * its active-thread percentage of them, rounded up to whole TPCs (mps_sm_count); a plain
     * context the whole GPU's. The probe sizes its default grid from this, so tests that want
     * a GPU share of work pass --grid 132. The library never reads it (mps_scale reads
     * cuCtxGetExecAffinity and the limits file's SM count). */
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *v = mig_view(NULL) ? (int)mig_view(NULL)->sms : sim_me && sim_me->mps_server ? mps_sm_count() : SIM_SM_COUNT;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = CLOCK_KHZ; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *v = (int)__atomic_load_n(&sim->dev[d].compute_mode, __ATOMIC_RELAXED); break;
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}

/* ---- contexts ---- */
SIM_API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    NEED_INIT();
    VALID_DEV(d);
    if (sim_ctx_claim(d) != 0) return CUDA_ERROR_DEVICE_UNAVAILABLE;
    *c = &g_primary[d];
    return CUDA_SUCCESS;
}
SIM_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { NEED_INIT(); VALID_DEV(d); return CUDA_SUCCESS; }
SIM_API CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }
SIM_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { NEED_INIT(); VALID_DEV(d); return CUDA_SUCCESS; }
SIM_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int f) { (void)f; NEED_INIT(); VALID_DEV(d); return CUDA_SUCCESS; }
SIM_API CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active)
{
    NEED_INIT();
    VALID_DEV(d);
    if (flags) *flags = 0;
    if (active) *active = 1;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxCreate_v2(CUcontext *pc, unsigned int flags, CUdevice d)
{
    (void)flags;
    NEED_INIT();
    VALID_DEV(d);
    if (sim_ctx_claim(d) != 0) return CUDA_ERROR_DEVICE_UNAVAILABLE;
    CUcontext c = malloc(sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    c->dev = d;
    *pc = me()->cur = c;
    return CUDA_SUCCESS;
}
SIM_API CUresult cuCtxCreate_v4(CUcontext *pc, void *params, unsigned int flags, CUdevice d)
{
    (void)params;
    return cuCtxCreate_v2(pc, flags, d);
}
SIM_API CUresult cuCtxDestroy_v2(CUcontext c)
{
    NEED_INIT();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    struct sim_thread *t = me();
    if (t->cur == c) t->cur = NULL;
    if (c < &g_primary[0] || c > &g_primary[SIM_MAX_DEV - 1]) free(c);
    return CUDA_SUCCESS;
}
SIM_API CUresult cuCtxSetCurrent(CUcontext c) { NEED_INIT(); me()->cur = c; return CUDA_SUCCESS; }
SIM_API CUresult cuCtxGetCurrent(CUcontext *c) { NEED_INIT(); *c = me()->cur; return CUDA_SUCCESS; }
SIM_API CUresult cuCtxPushCurrent_v2(CUcontext c)
{
    NEED_INIT();
    struct sim_thread *t = me();
    if (t->depth >= 16) return CUDA_ERROR_INVALID_VALUE;
    t->stack[t->depth++] = t->cur;
    t->cur = c;
    return CUDA_SUCCESS;
}
SIM_API CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
    NEED_CTX();
    struct sim_thread *t = me();
    if (c) *c = t->cur;
    t->cur = t->depth > 0 ? t->stack[--t->depth] : NULL;
    return CUDA_SUCCESS;
}
SIM_API CUresult cuCtxGetDevice(CUdevice *d)
{
    NEED_CTX();
    *d = ordinal_of(me()->cur->dev);
    return CUDA_SUCCESS;
}
/* "only supported under Volta+ MPS" (cuda.h): a plain context has no execution affinity */
/* An MPS client's context answers the SMs its server gives it; any other context answers all the
 * SMs it can use (its MIG instance's, or the GPU's), as the H200's driver did for a plain context
 * (hack/gpu-validate.sh section 6, 2026-11-28; docs/validation.md), not an error. */
SIM_API CUresult cuCtxGetExecAffinity(CUexecAffinityParam *p, int type)
{
    NEED_CTX();
    if (!p || type != CU_EXEC_AFFINITY_TYPE_SM_COUNT) return CUDA_ERROR_INVALID_VALUE;
    p->type = type;
    p->param.smCount.val = mig_view(NULL)                   ? mig_view(NULL)->sms
                           : sim_me && sim_me->mps_server ? (unsigned)mps_sm_count()
                                                          : SIM_SM_COUNT;
    return CUDA_SUCCESS;
}
static void wait_idle(void)
{
    int dev = me()->cur->dev;
    sim_wait(dev, sim_position(dev));
}

/* ---- stream capture: the real driver's rules, stricter for event records ----
 * Work launched into a capturing stream becomes a graph node instead of running. These
 * invalidate a capture (the call fails, later captured calls and cuStreamEndCapture fail with
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED):
 *  - cuEventRecord, cuStreamSynchronize or cuStreamQuery on the capturing stream (the real
 *    driver turns an event record into a capture dependency; here any is an error, so that a
 *    library that records its own events into someone's graph is caught);
 *  - in global mode (thread-local: from the capturing thread) a synchronising call anywhere
 *    in the process: cuEventQuery, cuEventSynchronize, cuStreamSynchronize/Query of another
 *    stream, cuCtxSynchronize;
 *  - any use of the legacy default stream while a blocking stream captures (it would wait for
 *    that stream). */
#define MAX_CAPTURES 64
static struct CUstream_st *g_capt[MAX_CAPTURES];
static pthread_mutex_t g_capt_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_capture_ids;
static int g_ncapt; /* active captures: the launch path looks no further while 0 */

/* NULL: the legacy default stream */
static struct CUstream_st *stream_of(CUstream s, int ptsz)
{
    if (s == CU_STREAM_PER_THREAD || (s == NULL && ptsz)) return &me()->ptds;
    if (s == NULL || s == CU_STREAM_LEGACY) return NULL;
    return s;
}

/* invalidate the active captures that `hit` selects; 1 if any */
static int invalidate(int (*hit)(struct CUstream_st *))
{
    int any = 0;
    if (!__atomic_load_n(&g_ncapt, __ATOMIC_ACQUIRE)) return 0;
    pthread_mutex_lock(&g_capt_lock);
    for (int i = 0; i < MAX_CAPTURES; i++)
        if (g_capt[i] && !g_capt[i]->invalidated && hit(g_capt[i])) g_capt[i]->invalidated = any = 1;
    pthread_mutex_unlock(&g_capt_lock);
    return any;
}
static int blocking(struct CUstream_st *c) { return !(c->flags & CU_STREAM_NON_BLOCKING); }
static int sync_forbidden(struct CUstream_st *c)
{
    return c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
           (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && pthread_equal(c->thread, pthread_self()));
}
static int any_blocking_capture(void)
{
    int any = 0;
    pthread_mutex_lock(&g_capt_lock);
    for (int i = 0; i < MAX_CAPTURES; i++) any |= g_capt[i] && blocking(g_capt[i]);
    pthread_mutex_unlock(&g_capt_lock);
    return any;
}

/* a synchronising call: fails if it breaks a capture */
static CUresult sync_call(void)
{
    return invalidate(sync_forbidden) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* before work or a record on stream st: GO, or the call's result (captured: CUDA_SUCCESS) */
#define GO (-1)
static CUresult capture_use(struct CUstream_st *st, uint64_t ns, int record)
{
    if (!st) return invalidate(blocking) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : GO;
    if (!__atomic_load_n(&st->capturing, __ATOMIC_ACQUIRE)) return GO;
    if (st->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (record) {
        st->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    st->graph->ns += ns;
    st->graph->nodes++;
    return CUDA_SUCCESS;
}

static CUresult begin_capture(CUstream s, int ptsz, int mode)
{
    NEED_CTX();
    struct CUstream_st *st = stream_of(s, ptsz);
    if (!st) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (st->capturing || mode < 0 || mode > 2) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_capt_lock);
    int i = 0;
    while (i < MAX_CAPTURES && g_capt[i]) i++;
    if (i < MAX_CAPTURES) {
        g_capt[i] = st;
        st->graph = g;
        st->mode = mode;
        st->invalidated = 0;
        st->thread = pthread_self();
        st->id = ++g_capture_ids;
        __atomic_store_n(&st->capturing, 1, __ATOMIC_RELEASE);
        __atomic_add_fetch(&g_ncapt, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_capt_lock);
    if (i == MAX_CAPTURES) free(g);
    return i < MAX_CAPTURES ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
SIM_API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m) { return begin_capture(s, 0, m); }
SIM_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m) { return begin_capture(s, 1, m); }
SIM_API CUresult cuStreamBeginCapture(CUstream s) { return begin_capture(s, 0, CU_STREAM_CAPTURE_MODE_GLOBAL); }
SIM_API CUresult cuStreamBeginCapture_ptsz(CUstream s) { return begin_capture(s, 1, CU_STREAM_CAPTURE_MODE_GLOBAL); }

static CUresult end_capture(CUstream s, int ptsz, CUgraph *out)
{
    NEED_CTX();
    struct CUstream_st *st = stream_of(s, ptsz);
    if (!out || !st || !st->capturing) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_capt_lock);
    for (int i = 0; i < MAX_CAPTURES; i++)
        if (g_capt[i] == st) g_capt[i] = NULL;
    __atomic_store_n(&st->capturing, 0, __ATOMIC_RELEASE);
    __atomic_sub_fetch(&g_ncapt, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_capt_lock);
    *out = st->invalidated ? NULL : st->graph;
    if (st->invalidated) free(st->graph);
    st->graph = NULL;
    return *out ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
}
SIM_API CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { return end_capture(s, 0, g); }
SIM_API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return end_capture(s, 1, g); }

static CUresult capture_info(CUstream s, int ptsz, CUstreamCaptureStatus *status, cuuint64_t *id)
{
    NEED_CTX();
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = stream_of(s, ptsz);
    if (!st) { /* the legacy stream cannot capture; asking while a blocking stream does is an error */
        *status = CU_STREAM_CAPTURE_STATUS_NONE;
        return any_blocking_capture() ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
    }
    int c = __atomic_load_n(&st->capturing, __ATOMIC_ACQUIRE);
    *status = !c ? CU_STREAM_CAPTURE_STATUS_NONE
                 : st->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (id && c) *id = st->id;
    return CUDA_SUCCESS;
}
SIM_API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st) { return capture_info(s, 0, st, NULL); }
SIM_API CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st) { return capture_info(s, 1, st, NULL); }
SIM_API CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id)
{
    return capture_info(s, 0, st, id);
}
SIM_API CUresult cuStreamGetCaptureInfo_ptsz(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id)
{
    return capture_info(s, 1, st, id);
}
static CUresult capture_info_v2(CUstream s, int ptsz, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                const CUgraphNode **deps, size_t *ndeps)
{
    CUresult rc = capture_info(s, ptsz, st, id);
    struct CUstream_st *x = stream_of(s, ptsz);
    if (g) *g = rc == CUDA_SUCCESS && x && x->capturing ? x->graph : NULL;
    if (deps) *deps = NULL;
    if (ndeps) *ndeps = 0;
    return rc;
}
SIM_API CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                           const CUgraphNode **deps, size_t *ndeps)
{
    return capture_info_v2(s, 0, st, id, g, deps, ndeps);
}
SIM_API CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                                const CUgraphNode **deps, size_t *ndeps)
{
    return capture_info_v2(s, 1, st, id, g, deps, ndeps);
}

SIM_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    (void)flags;
    NEED_CTX();
    if (!e || !g) return CUDA_ERROR_INVALID_VALUE;
    *e = malloc(sizeof **e);
    if (!*e) return CUDA_ERROR_OUT_OF_MEMORY;
    (*e)->ns = g->ns;
    (*e)->nodes = g->nodes;
    return CUDA_SUCCESS;
}
SIM_API CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    (void)err, (void)log, (void)n;
    return cuGraphInstantiateWithFlags(e, g, 0);
}
SIM_API CUresult cuGraphDestroy(CUgraph g) { NEED_INIT(); free(g); return CUDA_SUCCESS; }
SIM_API CUresult cuGraphExecDestroy(CUgraphExec e) { NEED_INIT(); free(e); return CUDA_SUCCESS; }

SIM_API CUresult cuCtxSynchronize(void)
{
    NEED_CTX();
    CUresult rc = sync_call();
    if (rc == CUDA_SUCCESS) wait_idle();
    return rc;
}

/* ---- streams and events: one timeline per process, shared by its streams ---- */
SIM_API CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    NEED_CTX();
    *s = calloc(1, sizeof **s);
    if (*s) (*s)->flags = flags;
    return *s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
SIM_API CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int prio)
{
    (void)prio;
    return cuStreamCreate(s, flags);
}
SIM_API CUresult cuStreamDestroy_v2(CUstream s) { NEED_INIT(); free(s); return CUDA_SUCCESS; }
/* stream sync/query: the capturing stream itself, or a synchronising call */
static CUresult stream_check(CUstream s, int ptsz)
{
    struct CUstream_st *st = stream_of(s, ptsz);
    if (st && __atomic_load_n(&st->capturing, __ATOMIC_ACQUIRE)) {
        st->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (!st && any_blocking_capture()) return invalidate(blocking), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return sync_call();
}
static CUresult stream_sync(CUstream s, int ptsz)
{
    NEED_CTX();
    CUresult rc = stream_check(s, ptsz);
    if (rc == CUDA_SUCCESS) wait_idle();
    return rc;
}
SIM_API CUresult cuStreamSynchronize(CUstream s) { return stream_sync(s, 0); }
SIM_API CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_sync(s, 1); }
static CUresult stream_query(CUstream s, int ptsz)
{
    NEED_CTX();
    CUresult rc = stream_check(s, ptsz);
    if (rc != CUDA_SUCCESS) return rc;
    int dev = me()->cur->dev;
    return sim_done(dev, sim_position(dev)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
SIM_API CUresult cuStreamQuery(CUstream s) { return stream_query(s, 0); }
SIM_API CUresult cuStreamQuery_ptsz(CUstream s) { return stream_query(s, 1); }

SIM_API CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    (void)flags;
    NEED_CTX();
    *e = calloc(1, sizeof **e);
    return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
/* Which event holds each watch of this process's ring (sim_enqueue_watched): when a record
 * takes a slot over, the event that held it gets its time now if it was reached. Without this,
 * an event queried after SIM_WATCHES later records (the library's cost samples, read 10 ms later
 * beside the probe's event every 16 launches) fell back to the stretches of running, which are
 * one per kernel when launches are slower than kernels, and read a time too late: a 4 us
 * kernel's sample came out below 4 us and a Hard 30 claim of them took 39 % (issue 29). */

static void watch_release(CUevent e) /* under g_watch_lock */
{
    if (e->recorded && e->watch < SIM_WATCHES && g_watch_owner[e->dev][e->watch] == e)
        g_watch_owner[e->dev][e->watch] = NULL;
}

SIM_API CUresult cuEventDestroy_v2(CUevent e)
{
    NEED_INIT();
    if (e) {
        pthread_mutex_lock(&g_watch_lock);
        watch_release(e);
        pthread_mutex_unlock(&g_watch_lock);
    }
    free(e);
    return CUDA_SUCCESS;
}
static CUresult event_record(CUevent e, CUstream s, int ptsz)
{
    NEED_CTX();
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = capture_use(stream_of(s, ptsz), 0, 1);
    if (rc != GO) return rc;
    int dev = me()->cur->dev;
    e->dev = dev;
    e->rec_t = sim_now_ns();
    /* A record is a command of the context, timestamped when the context runs it: 1 ns of
     * work, so that on an empty queue it still waits for the context's turn. Free kernels
     * (KERNEL_US=0) never move the GPU clock: timing a launch measures 0. */
    pthread_mutex_lock(&g_watch_lock);
    watch_release(e);
    e->watch = ~0u;
    e->t = sim_kernel_ns == 0 ? 1 : 0;
    if (sim_kernel_ns == 0) {
        e->pos = sim_position(dev);
    } else {
        struct sim_seg evicted;
        e->pos = sim_enqueue_watched(dev, 1, &e->watch, &evicted);
        CUevent old = g_watch_owner[dev][e->watch];
        if (old && old != e && old->pos == evicted.done0 && evicted.t0 && !old->t)
            old->t = evicted.t0 > old->rec_t ? evicted.t0 : old->rec_t;
        g_watch_owner[dev][e->watch] = e;
    }
    e->recorded = 1;
    pthread_mutex_unlock(&g_watch_lock);
    return CUDA_SUCCESS;
}
SIM_API CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }
SIM_API CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s, 1); }

/* 1 if e has completed, its time resolved */
static int event_done(CUevent e)
{
    if (!e->recorded || e->t) return 1;
    if (!sim_done(e->dev, e->pos)) return 0;
    e->t = sim_pos_time(e->dev, e->pos, e->watch, e->rec_t);
    return 1;
}
SIM_API CUresult cuEventQuery(CUevent e)
{
    NEED_INIT();
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = sync_call();
    if (rc != CUDA_SUCCESS) return rc;
    return event_done(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
SIM_API CUresult cuEventSynchronize(CUevent e)
{
    NEED_INIT();
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = sync_call();
    if (rc != CUDA_SUCCESS) return rc;
    if (!event_done(e)) {
        sim_wait(e->dev, e->pos);
        event_done(e);
    }
    return CUDA_SUCCESS;
}
SIM_API CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b)
{
    NEED_INIT();
    if (!ms || !a || !b || !a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    if (!event_done(a) || !event_done(b)) return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)b->t - (double)a->t) / 1e6);
    return CUDA_SUCCESS;
}
SIM_API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime_v2(ms, a, b); }

/* ---- errors ---- */
static const struct { CUresult code; const char *name, *text; } g_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "the provided execution affinity is not supported"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
static CUresult error_lookup(CUresult e, const char **s, int text)
{
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == e) {
            *s = text ? g_errors[i].text : g_errors[i].name;
            return CUDA_SUCCESS;
        }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
SIM_API CUresult cuGetErrorName(CUresult e, const char **s) { return error_lookup(e, s, 0); }
SIM_API CUresult cuGetErrorString(CUresult e, const char **s) { return error_lookup(e, s, 1); }

/* ---- modules: any image is accepted, every kernel takes GPUSHARE_SIM_KERNEL_US ---- */
static uint64_t new_handle(void) { return __atomic_add_fetch(&g_next_handle, 1, __ATOMIC_RELAXED); }
SIM_API CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    NEED_CTX();
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    *m = (CUmodule)(uintptr_t)(0x1000 + new_handle() * 16);
    return CUDA_SUCCESS;
}
SIM_API CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, void *opts, void **vals)
{
    (void)n, (void)opts, (void)vals;
    return cuModuleLoadData(m, image);
}
SIM_API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    NEED_CTX();
    if (!f || !m || !name) return CUDA_ERROR_INVALID_VALUE;
    /* "spin" (the probe's kernel) runs for its cycle count: flag 8 in the handle */
    *f = (CUfunction)(uintptr_t)(0x100000 + new_handle() * 16 + (strcmp(name, "spin") == 0 ? SPIN : 0));
    return CUDA_SUCCESS;
}
SIM_API CUresult cuModuleUnload(CUmodule m) { (void)m; NEED_INIT(); return CUDA_SUCCESS; }

/* ---- memory ---- */
static CUresult sim_alloc(int dev, uint64_t size, int kind, unsigned long long *out)
{
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (dev >= 0 && sim_mem_reserve(dev, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t key = ((uint64_t)(dev + 2) << 40) | (new_handle() << 8);
    if (gs_ptrmap_put(&g_allocs, kind, key, size, dev) != 0) {
        if (dev >= 0) sim_mem_unreserve(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = key;
    return CUDA_SUCCESS;
}

static CUresult sim_free(int kind, uint64_t key)
{
    struct gs_ptr_entry e;
    if (!gs_ptrmap_take(&g_allocs, kind, key, &e)) return CUDA_ERROR_INVALID_VALUE;
    if (e.gpu >= 0) sim_mem_unreserve(e.gpu, e.size);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemGetInfo_v2(size_t *fr, size_t *tot)
{
    NEED_CTX();
    struct sim_dev *d = &sim->dev[me()->cur->dev];
    uint64_t used = __atomic_load_n(&d->used, __ATOMIC_RELAXED), total = d->total;
    int mdev, slot;
    if (sim_mig_visible(&mdev, &slot) == 0) { /* the instance's memory, which only its processes use */
        used = __atomic_load_n(&sim->mig[mdev].gi[slot].used, __ATOMIC_RELAXED);
        total = sim_mig_profile_of(mdev, &sim->mig[mdev].gi[slot])->memory_mib << 20;
    }
    *tot = total;
    *fr = used < total ? total - used : 0;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    NEED_CTX();
    return sim_alloc(me()->cur->dev, size, GS_KIND_PTR, p);
}
SIM_API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags)
{
    (void)flags;
    return cuMemAlloc_v2(p, size);
}
SIM_API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int elem)
{
    NEED_CTX();
    if (!pitch || w == 0 || h == 0 || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
    size_t pw = w > SIZE_MAX - 511 ? SIZE_MAX : (w + 511) & ~(size_t)511;
    CUresult rc = sim_alloc(me()->cur->dev, gs_mul_sat(pw, h), GS_KIND_PTR, p);
    if (rc == CUDA_SUCCESS) *pitch = pw;
    return rc;
}
SIM_API CUresult cuMemFree_v2(CUdeviceptr p) { NEED_INIT(); return sim_free(GS_KIND_PTR, p); }
SIM_API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) { (void)s; return cuMemAlloc_v2(p, size); }
SIM_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream s) { return cuMemAllocAsync(p, size, s); }
SIM_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s)
{
    (void)pool;
    return cuMemAllocAsync(p, size, s);
}
SIM_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s)
{
    return cuMemAllocFromPoolAsync(p, size, pool, s);
}
SIM_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return cuMemFree_v2(p); }
SIM_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }

SIM_API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags)
{
    (void)flags;
    NEED_INIT();
    if (!h || !prop) return CUDA_ERROR_INVALID_VALUE;
    int dev = -1;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        dev = prop->location.id;
        VALID_DEV(dev);
    }
    return sim_alloc(dev, size, GS_KIND_VMM, h);
}
SIM_API CUresult cuMemRelease(CUmemGenericAllocationHandle h) { NEED_INIT(); return sim_free(GS_KIND_VMM, h); }
SIM_API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option)
{
    (void)prop, (void)option;
    NEED_INIT();
    *g = 2u << 20;
    return CUDA_SUCCESS;
}
SIM_API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                     unsigned long long flags)
{
    (void)size, (void)align, (void)addr, (void)flags;
    NEED_INIT();
    *p = (1ull << 46) | (new_handle() << 30);
    return CUDA_SUCCESS;
}
SIM_API CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { (void)p, (void)size; NEED_INIT(); return CUDA_SUCCESS; }
SIM_API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
                          unsigned long long flags)
{
    (void)p, (void)size, (void)off, (void)h, (void)flags;
    NEED_INIT();
    return CUDA_SUCCESS;
}
SIM_API CUresult cuMemUnmap(CUdeviceptr p, size_t size) { (void)p, (void)size; NEED_INIT(); return CUDA_SUCCESS; }
SIM_API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void *desc, size_t count)
{
    (void)p, (void)size, (void)desc, (void)count;
    NEED_INIT();
    return CUDA_SUCCESS;
}

SIM_API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    NEED_CTX();
    if (!a || !d) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long key;
    CUresult rc = sim_alloc(me()->cur->dev, gs_array_bytes(d), GS_KIND_ARRAY, &key);
    if (rc == CUDA_SUCCESS) *a = (CUarray)(uintptr_t)key;
    return rc;
}
SIM_API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    NEED_CTX();
    if (!a || !d) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long key;
    CUresult rc = sim_alloc(me()->cur->dev, gs_array3d_bytes(d, 1), GS_KIND_ARRAY, &key);
    if (rc == CUDA_SUCCESS) *a = (CUarray)(uintptr_t)key;
    return rc;
}
SIM_API CUresult cuArrayDestroy(CUarray a) { NEED_INIT(); return sim_free(GS_KIND_ARRAY, (uintptr_t)a); }
SIM_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    NEED_CTX();
    if (!m || !d) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long key;
    CUresult rc = sim_alloc(me()->cur->dev, gs_array3d_bytes(d, levels), GS_KIND_MIPMAP, &key);
    if (rc == CUDA_SUCCESS) *m = (CUmipmappedArray)(uintptr_t)key;
    return rc;
}
SIM_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) { NEED_INIT(); return sim_free(GS_KIND_MIPMAP, (uintptr_t)m); }

/* copies and memsets complete at once; device memory reads back as zeros */
SIM_API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { (void)d, (void)h, (void)n; NEED_CTX(); return CUDA_SUCCESS; }
SIM_API CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n)
{
    (void)d;
    NEED_CTX();
    wait_idle();
    memset(h, 0, n);
    return CUDA_SUCCESS;
}
SIM_API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { (void)d, (void)v, (void)n; NEED_CTX(); return CUDA_SUCCESS; }

/* ---- launches ---- */
static uint64_t kernel_ns(CUfunction f, void **params)
{
    if (((uintptr_t)f & SPIN) && params && params[0]) return *(uint64_t *)params[0] * 1000000 / CLOCK_KHZ;
    return sim_kernel_ns;
}

/* the share of the SMs (ppm) a kernel of this grid asks for: a block per SM, one wave at most;
 * it matters to MPS clients only (sim_sched.c) */
static uint32_t grid_demand(unsigned gx, unsigned gy, unsigned gz)
{
    uint64_t blocks = (uint64_t)gx * gy; /* saturates below: any grid past SIM_SM_COUNT blocks is full */
    if (blocks < SIM_SM_COUNT) blocks *= gz;
    return blocks >= SIM_SM_COUNT ? SIM_FULL : (uint32_t)(blocks * SIM_FULL / SIM_SM_COUNT);
}

/* The time a launch keeps the launching thread busy in the driver (GPUSHARE_SIM_LAUNCH_NS, the
 * H100's ~3.2 us by default, docs/compute.md): a busy wait on the monotonic clock (the thread's
 * CPU clock is a system call of microseconds on some machines, too coarse to wait on). */
static void launch_cpu(void)
{
    if (!sim_launch_ns) return;
    uint64_t end = sim_now_ns() + sim_launch_ns;
    while (sim_now_ns() < end) {}
}

/* ns of GPU work on stream s: into its capture, or queued behind this process's earlier work */
static CUresult launch(CUstream s, int ptsz, uint64_t ns, uint32_t demand)
{
    NEED_CTX();
    CUresult rc = capture_use(stream_of(s, ptsz), ns, 0);
    if (rc != GO) return rc;
    launch_cpu();
    if (ns == 0) return CUDA_SUCCESS;
    int dev = me()->cur->dev;
    uint64_t n = __atomic_fetch_add(&g_nlaunch[dev], 1, __ATOMIC_RELAXED);
    uint64_t *slot = &g_ends[dev][n % QUEUE_KERNELS];
    if (n >= QUEUE_KERNELS) sim_wait(dev, __atomic_load_n(slot, __ATOMIC_RELAXED)); /* the queue is full */
    __atomic_store_n(slot, sim_enqueue(dev, ns, demand), __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuLaunchKernel(GS_LAUNCH_ARGS, void **extra)
{
    (void)bx, (void)by, (void)bz, (void)shmem, (void)extra;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    return launch(s, 0, kernel_ns(f, params), grid_demand(gx, gy, gz));
}
SIM_API CUresult cuLaunchKernel_ptsz(GS_LAUNCH_ARGS, void **extra)
{
    (void)bx, (void)by, (void)bz, (void)shmem, (void)extra;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    return launch(s, 1, kernel_ns(f, params), grid_demand(gx, gy, gz));
}
SIM_API CUresult cuLaunchCooperativeKernel(GS_LAUNCH_ARGS)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, NULL);
}
SIM_API CUresult cuLaunchCooperativeKernel_ptsz(GS_LAUNCH_ARGS)
{
    return cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params, NULL);
}
SIM_API CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    (void)extra;
    if (!cfg || !f) return CUDA_ERROR_INVALID_VALUE;
    return launch(cfg->hStream, 0, kernel_ns(f, params), grid_demand(cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ));
}
SIM_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    (void)extra;
    if (!cfg || !f) return CUDA_ERROR_INVALID_VALUE;
    return launch(cfg->hStream, 1, kernel_ns(f, params), grid_demand(cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ));
}
/* a graph replay asks for every SM (its nodes' grids are not kept) */
SIM_API CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
    if (!g) return CUDA_ERROR_INVALID_HANDLE;
    return launch(s, 0, g->ns, SIM_FULL);
}
SIM_API CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
    if (!g) return CUDA_ERROR_INVALID_HANDLE;
    return launch(s, 1, g->ns, SIM_FULL);
}

/* ---- other device-memory paths (for the hook's tests of hook/README.md's list): legacy
 * CUDA < 3.2 entry points, graph memory nodes, context limits. Nodes added to a graph by
 * hand run nothing here (stream capture: above). ---- */
SIM_API CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int size)
{
    unsigned long long key;
    CUresult rc = cuMemAlloc_v2(&key, size);
    if (rc == CUDA_SUCCESS) *p = (CUdeviceptr_v1)key; /* the sim's keys are not 32-bit: tests only */
    return rc;
}
SIM_API CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned int *pitch, unsigned int w, unsigned int h,
                                 unsigned int elem)
{
    unsigned long long key;
    size_t pt;
    CUresult rc = cuMemAllocPitch_v2(&key, &pt, w, h, elem);
    if (rc == CUDA_SUCCESS) *p = (CUdeviceptr_v1)key, *pitch = (unsigned int)pt;
    return rc;
}
SIM_API CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY_DESCRIPTOR d2 = {d->Width, d->Height, d->Format, d->NumChannels};
    return cuArrayCreate_v2(a, &d2);
}
SIM_API CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d2 = {d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags};
    return cuArray3DCreate_v2(a, &d2);
}

SIM_API CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
    NEED_INIT();
    if (!g || flags) return CUDA_ERROR_INVALID_VALUE;
    *g = calloc(1, sizeof **g); /* empty: nodes added here run nothing (cuGraphDestroy frees it) */
    return *g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
/* the address is reserved at once; memory would come at launch (graphs do not run here) */
SIM_API CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                        CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    (void)deps, (void)ndeps;
    NEED_INIT();
    if (!node || !g || !params || params->bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    params->dptr = (1ull << 47) | (new_handle() << 20);
    *node = (CUgraphNode)(uintptr_t)(0x300000 + new_handle() * 16);
    return CUDA_SUCCESS;
}
SIM_API CUresult cuGraphAddNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                CUgraphNodeParams *params)
{
    if (params && params->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return cuGraphAddMemAllocNode(node, g, deps, ndeps, &params->alloc);
    NEED_INIT();
    if (!node || !g || !params) return CUDA_ERROR_INVALID_VALUE;
    *node = (CUgraphNode)(uintptr_t)(0x300000 + new_handle() * 16);
    return CUDA_SUCCESS;
}
SIM_API CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                   const CUgraphEdgeData *edges, size_t ndeps, CUgraphNodeParams *params)
{
    (void)edges;
    return cuGraphAddNode(node, g, deps, ndeps, params);
}

/* limits are remembered per process (enough for one context), not backed by device memory */
static size_t g_ctx_limits[3] = {1024, 1 << 20, 8 << 20};
SIM_API CUresult cuCtxSetLimit(int limit, size_t value)
{
    NEED_CTX();
    if (limit < 0 || limit > CU_LIMIT_MALLOC_HEAP_SIZE) return CUDA_ERROR_NOT_SUPPORTED;
    g_ctx_limits[limit] = value;
    return CUDA_SUCCESS;
}
SIM_API CUresult cuCtxGetLimit(size_t *value, int limit)
{
    NEED_CTX();
    if (!value || limit < 0 || limit > CU_LIMIT_MALLOC_HEAP_SIZE) return CUDA_ERROR_NOT_SUPPORTED;
    *value = g_ctx_limits[limit];
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress: base name + CUDA version + per-thread flag -> versioned entry ---- */
struct proc { const char *base; int version; int ptsz; void *fn; };
#define P(base, ver, ptsz, fn) {#base, ver, ptsz, (void *)fn}
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static const struct proc g_procs[] = {
    P(cuInit, 0, 0, cuInit), P(cuDriverGetVersion, 0, 0, cuDriverGetVersion),
    P(cuDeviceGet, 0, 0, cuDeviceGet), P(cuDeviceGetCount, 0, 0, cuDeviceGetCount),
    P(cuDeviceGetName, 0, 0, cuDeviceGetName), P(cuDeviceGetUuid, 0, 0, cuDeviceGetUuid),
    P(cuDeviceGetUuid, 11040, 0, cuDeviceGetUuid_v2), P(cuDeviceTotalMem, 3020, 0, cuDeviceTotalMem_v2),
    P(cuDeviceGetAttribute, 0, 0, cuDeviceGetAttribute),
    P(cuDevicePrimaryCtxRetain, 0, 0, cuDevicePrimaryCtxRetain),
    P(cuDevicePrimaryCtxRelease, 11000, 0, cuDevicePrimaryCtxRelease_v2),
    P(cuDevicePrimaryCtxReset, 11000, 0, cuDevicePrimaryCtxReset_v2),
    P(cuDevicePrimaryCtxSetFlags, 11000, 0, cuDevicePrimaryCtxSetFlags_v2),
    P(cuDevicePrimaryCtxGetState, 0, 0, cuDevicePrimaryCtxGetState),
    P(cuCtxCreate, 3020, 0, cuCtxCreate_v2), P(cuCtxCreate, 12050, 0, cuCtxCreate_v4),
    P(cuCtxDestroy, 4000, 0, cuCtxDestroy_v2), P(cuCtxSetCurrent, 0, 0, cuCtxSetCurrent),
    P(cuCtxGetCurrent, 0, 0, cuCtxGetCurrent), P(cuCtxPushCurrent, 4000, 0, cuCtxPushCurrent_v2),
    P(cuCtxPopCurrent, 4000, 0, cuCtxPopCurrent_v2), P(cuCtxGetDevice, 0, 0, cuCtxGetDevice),
    P(cuCtxGetExecAffinity, 11040, 0, cuCtxGetExecAffinity),
    P(cuCtxSynchronize, 0, 0, cuCtxSynchronize),
    P(cuStreamCreate, 0, 0, cuStreamCreate), P(cuStreamCreateWithPriority, 0, 0, cuStreamCreateWithPriority),
    P(cuStreamDestroy, 4000, 0, cuStreamDestroy_v2), P(cuStreamSynchronize, 0, 0, cuStreamSynchronize),
    P(cuStreamSynchronize, 0, 1, cuStreamSynchronize_ptsz), P(cuStreamQuery, 0, 0, cuStreamQuery),
    P(cuEventCreate, 0, 0, cuEventCreate), P(cuEventDestroy, 4000, 0, cuEventDestroy_v2),
    P(cuEventRecord, 0, 0, cuEventRecord), P(cuEventRecord, 0, 1, cuEventRecord_ptsz),
    P(cuEventQuery, 0, 0, cuEventQuery), P(cuEventSynchronize, 0, 0, cuEventSynchronize),
    P(cuEventElapsedTime, 0, 0, cuEventElapsedTime), P(cuEventElapsedTime, 12080, 0, cuEventElapsedTime_v2),
    P(cuGetErrorName, 0, 0, cuGetErrorName), P(cuGetErrorString, 0, 0, cuGetErrorString),
    P(cuModuleLoadData, 0, 0, cuModuleLoadData), P(cuModuleLoadDataEx, 0, 0, cuModuleLoadDataEx),
    P(cuModuleGetFunction, 0, 0, cuModuleGetFunction), P(cuModuleUnload, 0, 0, cuModuleUnload),
    P(cuGetProcAddress, 0, 0, cuGetProcAddress), P(cuGetProcAddress, 12000, 0, cuGetProcAddress_v2),
    P(cuMemGetInfo, 3020, 0, cuMemGetInfo_v2), P(cuMemAlloc, 3020, 0, cuMemAlloc_v2),
    P(cuMemAllocPitch, 3020, 0, cuMemAllocPitch_v2), P(cuMemAllocManaged, 0, 0, cuMemAllocManaged),
    P(cuMemFree, 3020, 0, cuMemFree_v2),
    P(cuMemAllocAsync, 0, 0, cuMemAllocAsync), P(cuMemAllocAsync, 0, 1, cuMemAllocAsync_ptsz),
    P(cuMemAllocFromPoolAsync, 0, 0, cuMemAllocFromPoolAsync),
    P(cuMemAllocFromPoolAsync, 0, 1, cuMemAllocFromPoolAsync_ptsz),
    P(cuMemFreeAsync, 0, 0, cuMemFreeAsync), P(cuMemFreeAsync, 0, 1, cuMemFreeAsync_ptsz),
    P(cuMemCreate, 0, 0, cuMemCreate), P(cuMemRelease, 0, 0, cuMemRelease),
    P(cuMemGetAllocationGranularity, 0, 0, cuMemGetAllocationGranularity),
    P(cuMemAddressReserve, 0, 0, cuMemAddressReserve), P(cuMemAddressFree, 0, 0, cuMemAddressFree),
    P(cuMemMap, 0, 0, cuMemMap), P(cuMemUnmap, 0, 0, cuMemUnmap), P(cuMemSetAccess, 0, 0, cuMemSetAccess),
    P(cuArrayCreate, 3020, 0, cuArrayCreate_v2), P(cuArray3DCreate, 3020, 0, cuArray3DCreate_v2),
    P(cuArrayDestroy, 0, 0, cuArrayDestroy), P(cuMipmappedArrayCreate, 0, 0, cuMipmappedArrayCreate),
    P(cuMipmappedArrayDestroy, 0, 0, cuMipmappedArrayDestroy),
    P(cuMemcpyHtoD, 3020, 0, cuMemcpyHtoD_v2), P(cuMemcpyDtoH, 3020, 0, cuMemcpyDtoH_v2),
    P(cuMemsetD8, 3020, 0, cuMemsetD8_v2),
    P(cuLaunchKernel, 0, 0, cuLaunchKernel), P(cuLaunchKernel, 0, 1, cuLaunchKernel_ptsz),
    P(cuLaunchKernelEx, 0, 0, cuLaunchKernelEx), P(cuLaunchKernelEx, 0, 1, cuLaunchKernelEx_ptsz),
    P(cuLaunchCooperativeKernel, 0, 0, cuLaunchCooperativeKernel),
    P(cuLaunchCooperativeKernel, 0, 1, cuLaunchCooperativeKernel_ptsz),
    P(cuGraphLaunch, 0, 0, cuGraphLaunch), P(cuGraphLaunch, 0, 1, cuGraphLaunch_ptsz),
    P(cuStreamQuery, 0, 1, cuStreamQuery_ptsz),
    P(cuStreamBeginCapture, 0, 0, cuStreamBeginCapture), P(cuStreamBeginCapture, 0, 1, cuStreamBeginCapture_ptsz),
    P(cuStreamBeginCapture, 10010, 0, cuStreamBeginCapture_v2),
    P(cuStreamBeginCapture, 10010, 1, cuStreamBeginCapture_v2_ptsz),
    P(cuStreamEndCapture, 0, 0, cuStreamEndCapture), P(cuStreamEndCapture, 0, 1, cuStreamEndCapture_ptsz),
    P(cuStreamIsCapturing, 0, 0, cuStreamIsCapturing), P(cuStreamIsCapturing, 0, 1, cuStreamIsCapturing_ptsz),
    P(cuStreamGetCaptureInfo, 0, 0, cuStreamGetCaptureInfo),
    P(cuStreamGetCaptureInfo, 0, 1, cuStreamGetCaptureInfo_ptsz),
    P(cuStreamGetCaptureInfo, 11030, 0, cuStreamGetCaptureInfo_v2),
    P(cuStreamGetCaptureInfo, 11030, 1, cuStreamGetCaptureInfo_v2_ptsz),
    P(cuGraphInstantiate, 11000, 0, cuGraphInstantiate_v2),
    P(cuGraphInstantiate, 12000, 0, cuGraphInstantiateWithFlags),
    P(cuGraphInstantiateWithFlags, 0, 0, cuGraphInstantiateWithFlags),
    P(cuGraphDestroy, 0, 0, cuGraphDestroy), P(cuGraphExecDestroy, 0, 0, cuGraphExecDestroy),
    /* other device-memory paths (block above) */
    P(cuMemAlloc, 0, 0, cuMemAlloc), P(cuMemAllocPitch, 0, 0, cuMemAllocPitch),
    P(cuArrayCreate, 0, 0, cuArrayCreate), P(cuArray3DCreate, 0, 0, cuArray3DCreate),
    P(cuGraphCreate, 0, 0, cuGraphCreate),
    P(cuGraphAddMemAllocNode, 0, 0, cuGraphAddMemAllocNode), P(cuGraphAddNode, 0, 0, cuGraphAddNode),
    P(cuGraphAddNode, 12030, 0, cuGraphAddNode_v2),
    P(cuCtxSetLimit, 0, 0, cuCtxSetLimit), P(cuCtxGetLimit, 0, 0, cuCtxGetLimit),
};

SIM_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct proc *best = NULL;
    int found = 0;
    for (int pass = 0; pass < 2 && !best; pass++) { /* per-thread variant first, if asked */
        for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
            const struct proc *p = &g_procs[i];
            if (strcmp(p->base, symbol) != 0 || p->ptsz != (pass == 0 && want_ptsz)) continue;
            found = 1;
            if (p->version <= version && (!best || p->version > best->version)) best = p;
        }
    }
    *pfn = best ? best->fn : NULL;
    if (status)
        *status = best ? CU_GET_PROC_ADDRESS_SUCCESS
                       : found ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

SIM_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
