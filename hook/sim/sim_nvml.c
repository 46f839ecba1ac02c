/* Simulated NVML (libnvidia-ml.so.1) over the same state as the simulated driver. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../src/cuda_abi.h"
#include "../src/rawstat.h"
#include "sim_state.h"

struct nvmlDevice_st { int index; int mig; }; /* mig: the GPU instance slot of a MIG device's handle, -1 a GPU */
static struct nvmlDevice_st g_devs[SIM_MAX_DEV];
static int g_inited;
static uint64_t g_util_prev_t[SIM_MAX_DEV], g_util_prev_busy[SIM_MAX_DEV];

#define NEED_INIT()                                                        \
    do {                                                                   \
        if (!g_inited || sim_open() != 0) return NVML_ERROR_UNINITIALIZED; \
    } while (0)
#define DEV(d)                                                             \
    do {                                                                   \
        NEED_INIT();                                                       \
        if (!(d) || (d) < &g_devs[0] || (d) >= &g_devs[sim->ndev]) return NVML_ERROR_INVALID_ARGUMENT; \
    } while (0)

SIM_API nvmlReturn_t nvmlInit_v2(void)
{
    if (sim_open() != 0) return NVML_ERROR_UNKNOWN;
    for (int i = 0; i < SIM_MAX_DEV; i++) g_devs[i] = (struct nvmlDevice_st){i, -1};
    g_inited = 1;
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
SIM_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }
SIM_API nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

SIM_API const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case 10: return "Timeout"; /* NVML_ERROR_TIMEOUT: nvmlEventSetWait */
    case 19: return "In use by another client"; /* NVML_ERROR_IN_USE */
    case 23: return "Insufficient resources"; /* NVML_ERROR_INSUFFICIENT_RESOURCES */
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src)
{
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) { NEED_INIT(); return copy_str(v, len, "580.0.0"); }
SIM_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) { NEED_INIT(); return copy_str(v, len, "13.580.0"); }
SIM_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { NEED_INIT(); *v = 13000; return NVML_SUCCESS; }
SIM_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* Indexes are the GPUs this process can open, numbered from 0 (sim_visible_count, sim_state.h) */
SIM_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { NEED_INIT(); *n = sim_visible_count(); return NVML_SUCCESS; }
SIM_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }
SIM_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    NEED_INIT();
    int physical = sim_visible_physical((int)i);
    if (!d || physical < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &g_devs[physical];
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }
static nvmlReturn_t nvml_mig_by_uuid(const char *uuid, nvmlDevice_t *d);
SIM_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
    NEED_INIT();
    char s[96];
    for (unsigned i = 0; uuid && i < sim->ndev; i++) {
        sim_uuid_string((int)i, s, sizeof s);
        if (strcmp(s, uuid) == 0 && sim_visible_ordinal((int)i) >= 0) {
            *d = &g_devs[i];
            return NVML_SUCCESS;
        }
    }
    return nvml_mig_by_uuid(uuid, d);
}
SIM_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i)
{
    DEV(d);
    int ordinal = sim_visible_ordinal(d->index);
    if (ordinal < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *i = (unsigned)ordinal;
    return NVML_SUCCESS;
}
/* The N of /dev/nvidiaN; the mock backend gives each simulated GPU its index as minor. */
SIM_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m) { DEV(d); *m = (unsigned)d->index; return NVML_SUCCESS; }
static int mig_handle_uuid(nvmlDevice_t d, char *out, unsigned len);
SIM_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    char m[96];
    if (mig_handle_uuid(d, m, sizeof m) == 0) return copy_str(uuid, len, m);
    DEV(d);
    char s[96];
    sim_uuid_string(d->index, s, sizeof s);
    return copy_str(uuid, len, s);
}
SIM_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) { DEV(d); return copy_str(name, len, "NVIDIA Simulated GPU"); }

/* the compute mode (nvmlComputeMode_t: 0 default, 2 prohibited, 3 exclusive process; the
 * deprecated exclusive thread, 1, is refused as the real driver does since CUDA 8). A real GPU
 * wants root to set it; here, whoever may write the state file. */
SIM_API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, unsigned int *mode)
{
    DEV(d);
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = __atomic_load_n(&sim->dev[d->index].compute_mode, __ATOMIC_RELAXED);
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t d, unsigned int mode)
{
    DEV(d);
    if (mode != SIM_COMPUTEMODE_DEFAULT && mode != SIM_COMPUTEMODE_PROHIBITED && mode != SIM_COMPUTEMODE_EXCLUSIVE_PROCESS)
        return NVML_ERROR_INVALID_ARGUMENT;
    __atomic_store_n(&sim->dev[d->index].compute_mode, mode, __ATOMIC_RELAXED);
    return NVML_SUCCESS;
}
/* an H100 SXM's: 132 SMs of 128 CUDA cores (SIM_SM_COUNT) */
SIM_API nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t d, unsigned int *cores) { DEV(d); *cores = SIM_SM_COUNT * 128; return NVML_SUCCESS; }
SIM_API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch) { DEV(d); *arch = 9; /* Hopper */ return NVML_SUCCESS; }
SIM_API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, int *brand) { DEV(d); *brand = 14; /* NVML_BRAND_NVIDIA */ return NVML_SUCCESS; }
/* GPU i sits on PCI bus i + 1 of domain 0 (dra_driver/discovery.py sim_pci_bus_id) */
SIM_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    DEV(d);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->bus = (unsigned)d->index + 1;
    pci->pciDeviceId = 0x233010de; /* H100 SXM5, vendor NVIDIA */
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus);
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", pci->bus);
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    DEV(d);
    *major = 9;
    *minor = 0;
    return NVML_SUCCESS;
}

static int mig_handle_memory(nvmlDevice_t d, nvmlMemory_t *m);
SIM_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    if (m && mig_handle_memory(d, m) == 0) return NVML_SUCCESS;
    DEV(d);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    sim_reap();
    struct sim_dev *sd = &sim->dev[d->index];
    m->total = sd->total;
    m->used = __atomic_load_n(&sd->used, __ATOMIC_RELAXED);
    m->free = m->used < m->total ? m->total - m->used : 0;
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlMemory_t v1;
    nvmlReturn_t rc = nvmlDeviceGetMemoryInfo(d, &v1);
    if (rc != NVML_SUCCESS) return rc;
    m->total = v1.total;
    m->reserved = 0;
    m->free = v1.free;
    m->used = v1.used;
    return NVML_SUCCESS;
}

/* live processes holding memory on or having run kernels on the device; mig_slot1 > 0: only
 * those in that GPU instance (slot + 1), as a MIG device's handle lists them */
static unsigned procs_on(int dev, uint32_t mig_slot1, struct sim_proc **out, unsigned max)
{
    unsigned n = 0;
    for (int i = 0; i < SIM_MAX_PROC; i++) {
        struct sim_proc *p = &sim->proc[i];
        if (!p->in_use || (!p->used[dev] && !p->busy_ns[dev])) continue;
        if (mig_slot1 && __atomic_load_n(&p->mig_slot1, __ATOMIC_RELAXED) != mig_slot1) continue;
        if (n < max) out[n] = p;
        n++;
    }
    return n;
}

/* The process's pid as the caller sees it, as the real driver answers host pids: a process
 * in another pid namespace (a container) is found by its namespace inode and the last
 * NSpid entry; cached per slot. 0 when it cannot be seen from here. */
static struct { uint64_t start_ns, pidns; int32_t pid, seen; } g_pid_cache[SIM_MAX_PROC];

static int32_t find_pid(uint64_t pidns, int32_t nspid)
{
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int32_t found = 0;
    struct dirent *e;
    char path[300], line[256];
    while (!found && (e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        struct stat st;
        snprintf(path, sizeof path, "/proc/%s/ns/pid", e->d_name);
        if (gs_stat(path, &st) != 0 || (uint64_t)st.st_ino != pidns) continue;
        snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
        FILE *f = fopen(path, "re");
        if (!f) continue;
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "NSpid:", 6)) {
                char *last = strrchr(line, '\t');
                if (last && atoi(last + 1) == nspid) found = atoi(e->d_name);
                break;
            }
        fclose(f);
    }
    closedir(d);
    return found;
}

/* One caller at a time: the agent's period and its backstop ask from two threads, and a
 * reader seeing the new key before find_pid() filled `seen` answered the slot's previous
 * occupant (a dead pid: the new process's memory unowned for that poll). */
static pthread_mutex_t g_pid_cache_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned caller_pid(struct sim_proc *p)
{
    static uint64_t mine;
    if (!mine) mine = sim_pidns();
    if (!p->pidns || p->pidns == mine) return (unsigned)p->pid;
    int slot = (int)(p - sim->proc);
    pthread_mutex_lock(&g_pid_cache_lock);
    if (g_pid_cache[slot].start_ns != p->start_ns || g_pid_cache[slot].pidns != p->pidns ||
        g_pid_cache[slot].pid != p->pid) {
        g_pid_cache[slot].start_ns = p->start_ns;
        g_pid_cache[slot].pidns = p->pidns;
        g_pid_cache[slot].pid = p->pid;
        g_pid_cache[slot].seen = find_pid(p->pidns, p->pid);
    }
    unsigned seen = (unsigned)g_pid_cache[slot].seen;
    pthread_mutex_unlock(&g_pid_cache_lock);
    return seen;
}

static struct sim_mig_gi *mig_of(nvmlDevice_t d);

/* nvmlDeviceGetComputeRunningProcesses as NVIDIA documents it for MIG mode (NVML API Reference,
 * nvmlDeviceGetComputeRunningProcesses_v3: "In MIG mode, if device handle is provided, the API
 * returns aggregate information, only if the caller has appropriate privileges. Per-instance
 * information can be queried by using specific MIG device handles"; nvmlProcessInfo_t: "If MIG is
 * enabled, stores a valid GPU instance ID", 0xFFFFFFFF otherwise): a MIG device's handle lists
 * the processes of its instance with their memory; the parent's lists every instance's, each with
 * its GPU and compute instance IDs. Not simulated: the privilege the aggregate needs (every caller
 * gets it here; the node agent reads MIG devices' handles, which need none). */
static nvmlReturn_t running(nvmlDevice_t d, unsigned int *count, void *infos, size_t stride)
{
    struct sim_mig_gi *mig = mig_of(d);
    if (!mig) DEV(d);
    int dev = d->index;
    struct sim_proc *ps[SIM_MAX_PROC];
    sim_reap();
    unsigned n = procs_on(dev, mig ? (uint32_t)d->mig + 1 : 0, ps, SIM_MAX_PROC);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!infos || *count < n) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned i = 0; i < n; i++) {
        uint32_t slot1 = __atomic_load_n(&ps[i]->mig_slot1, __ATOMIC_RELAXED);
        struct sim_mig_gi *gi = sim->mig[dev].mode && slot1 ? &sim->mig[dev].gi[slot1 - 1] : NULL;
        nvmlProcessInfo_t info = {caller_pid(ps[i]), __atomic_load_n(&ps[i]->used[dev], __ATOMIC_RELAXED),
                                  gi ? gi->id : 0xFFFFFFFFu, gi ? gi->ci_id : 0xFFFFFFFFu};
        memcpy((char *)infos + i * stride, &info, stride < sizeof info ? stride : sizeof info);
    }
    *count = n;
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p)
{
    return running(d, c, p, sizeof *p);
}
SIM_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p)
{
    return running(d, c, p, sizeof *p);
}
SIM_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p)
{
    return running(d, c, p, sizeof *p);
}

/* NVML API Reference, nvmlDeviceGetUtilizationRates: "On MIG-enabled GPUs, querying device
 * utilization rates is not currently supported"; nvmlDeviceGetProcessUtilization: "On
 * MIG-enabled GPUs, querying process utilization is not currently supported" (real drivers
 * answer NOT_SUPPORTED, e.g. github.com/XuehaiPan/nvitop/issues/5 on a GPU in MIG mode). So on a
 * MIG device's handle and on a GPU in MIG mode both are NOT_SUPPORTED here too. */
#define NO_UTILIZATION_IN_MIG(d)                                                             \
    do {                                                                                     \
        if (mig_of(d)) return NVML_ERROR_NOT_SUPPORTED;                                      \
        DEV(d);                                                                              \
        if (sim->mig[(d)->index].mode) return NVML_ERROR_NOT_SUPPORTED;                      \
    } while (0)

/* GPU busy share since this process's previous query (first query: since nvmlInit... or
 * since the process opened the simulator) */
SIM_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    NO_UTILIZATION_IN_MIG(d);
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    int i = d->index;
    uint64_t now = sim_now_ns(), busy = sim_busy_done(i);
    uint64_t t0 = g_util_prev_t[i] ? g_util_prev_t[i] : sim_me->start_ns;
    uint64_t b0 = g_util_prev_t[i] ? g_util_prev_busy[i] : busy;
    uint64_t dt = now > t0 ? now - t0 : 1;
    uint64_t pct = (busy - b0) * 100 / dt;
    u->gpu = pct > 100 ? 100 : (unsigned)pct;
    u->memory = 0;
    g_util_prev_t[i] = now;
    g_util_prev_busy[i] = busy;
    return NVML_SUCCESS;
}

/* per-process utilization as the real driver reports it: sampled (sim_sched.c). Each
 * process named in the samples newer than last_seen, with its mean over those sample
 * periods; a busy process can be missing, one period is noise. NOT_FOUND: no sample yet. */
SIM_API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *s,
                                                     unsigned int *count, unsigned long long last_seen)
{
    NO_UTILIZATION_IN_MIG(d);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    int32_t slots[SIM_SAMPLES];
    unsigned util[SIM_SAMPLES];
    uint64_t newest;
    unsigned n = sim_samples(d->index, last_seen, slots, util, &newest, SIM_SAMPLES);
    if (n == 0) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!s || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++)
        s[i] = (nvmlProcessUtilizationSample_t){caller_pid(&sim->proc[slots[i]]), newest, util[i], 0, 0, 0};
    *count = n;
    return NVML_SUCCESS;
}

/* ---- Events: XID and ECC (nvmlEventSet*) ------------------------------------------------
 * Injected by appending a line "<index> <type> [<data>]" to the events file,
 * $GPUSHARE_SIM_EVENTS, or "<state file>.events" beside $GPUSHARE_SIM_STATE:
 *   xid <n>   nvmlEventTypeXidCriticalError, eventData = n
 *   dbe       nvmlEventTypeDoubleBitEccError
 *   sbe       nvmlEventTypeSingleBitEccError
 * Each event set sees the lines appended after it was created, once. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SIM_NVML_ERROR_TIMEOUT 10
#define SIM_EV_SBE 0x1ull
#define SIM_EV_DBE 0x2ull
#define SIM_EV_XID 0x8ull
#define SIM_EV_SUPPORTED (SIM_EV_SBE | SIM_EV_DBE | SIM_EV_XID)

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} sim_nvmlEventData_t;

struct nvmlEventSet_st {
    FILE *f;
    unsigned long long mask[SIM_MAX_DEV];
};

static void events_path(char *out, size_t len)
{
    const char *p = getenv("GPUSHARE_SIM_EVENTS");
    const char *state = getenv("GPUSHARE_SIM_STATE");
    if (p && *p)
        snprintf(out, len, "%s", p);
    else
        snprintf(out, len, "%s.events", state && *state ? state : "/dev/shm/gpushare-sim.state");
}

SIM_API nvmlReturn_t nvmlEventSetCreate(struct nvmlEventSet_st **set)
{
    NEED_INIT();
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    char path[4096];
    events_path(path, sizeof path);
    mode_t old = umask(0);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    umask(old);
    if (fd < 0) return NVML_ERROR_UNKNOWN;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (!s || !(s->f = fdopen(fd, "r"))) {
        close(fd);
        free(s);
        return NVML_ERROR_UNKNOWN;
    }
    fseek(s->f, 0, SEEK_END);
    *set = s;
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlEventSetFree(struct nvmlEventSet_st *set)
{
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    fclose(set->f);
    free(set);
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types)
{
    DEV(d);
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    *types = SIM_EV_SUPPORTED;
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, struct nvmlEventSet_st *set)
{
    DEV(d);
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~SIM_EV_SUPPORTED) return NVML_ERROR_NOT_SUPPORTED;
    set->mask[d->index] |= types;
    return NVML_SUCCESS;
}

/* The next complete line as an event; 0 when none is there yet (a partial line is left). */
static int next_event(struct nvmlEventSet_st *set, sim_nvmlEventData_t *out)
{
    char line[128];
    for (;;) {
        long at = ftell(set->f);
        clearerr(set->f);
        if (!fgets(line, sizeof line, set->f)) return 0;
        if (!strchr(line, '\n')) {
            fseek(set->f, at, SEEK_SET);
            return 0;
        }
        unsigned idx;
        char type[8];
        unsigned long long data = 0;
        if (sscanf(line, "%u %7s %llu", &idx, type, &data) < 2 || idx >= sim->ndev) continue;
        unsigned long long ev = !strcmp(type, "xid") ? SIM_EV_XID : !strcmp(type, "dbe") ? SIM_EV_DBE
                              : !strcmp(type, "sbe") ? SIM_EV_SBE : 0;
        if (!(set->mask[idx] & ev)) continue;
        *out = (sim_nvmlEventData_t){&g_devs[idx], ev, ev == SIM_EV_XID ? data : 0, 0xFFFFFFFF, 0xFFFFFFFF};
        return 1;
    }
}

SIM_API nvmlReturn_t nvmlEventSetWait_v2(struct nvmlEventSet_st *set, sim_nvmlEventData_t *data, unsigned int timeout_ms)
{
    NEED_INIT();
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned waited = 0;; waited += 10) {
        if (next_event(set, data)) return NVML_SUCCESS;
        if (waited >= timeout_ms) return SIM_NVML_ERROR_TIMEOUT;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
}
SIM_API nvmlReturn_t nvmlEventSetWait(struct nvmlEventSet_st *set, sim_nvmlEventData_t *data, unsigned int timeout_ms)
{
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

/* ---- MIG (sim_mig.h; docs/mig.md) --------------------------------------------------------
 * The calls the kubelet plugin and nvidia-smi-like tools use, with NVML's error codes:
 * NOT_SUPPORTED on a GPU whose MIG mode is off or for a profile the GPU lacks,
 * INSUFFICIENT_RESOURCES for a placement that overlaps an instance or a profile whose instances
 * are all made, IN_USE for a GPU instance that still has its compute instance or a compute
 * instance with processes. nvmlDeviceSetMigMode is the operator's (the plugin only reads the mode). */
#define NVML_ERROR_IN_USE 19
#define NVML_ERROR_INSUFFICIENT_RESOURCES 23
#define NVML_GPU_INSTANCE_PROFILE_COUNT 0x12u
#define NVML_COMPUTE_INSTANCE_PROFILE_COUNT 0x9u

typedef struct { unsigned int start, size; } nvmlGpuInstancePlacement_t;
typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;
typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;
struct nvmlGpuInstance_st { int dev, slot; };
struct nvmlComputeInstance_st { int dev, slot; };
typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
typedef struct nvmlComputeInstance_st *nvmlComputeInstance_t;
typedef struct { nvmlDevice_t device; unsigned int id, profileId; nvmlGpuInstancePlacement_t placement; } nvmlGpuInstanceInfo_t;
typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;
typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;
typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

static struct nvmlGpuInstance_st g_gis[SIM_MAX_DEV][SIM_MIG_MAX_GI];
static struct nvmlComputeInstance_st g_cis[SIM_MAX_DEV][SIM_MIG_MAX_GI];
static struct nvmlDevice_st g_migs[SIM_MAX_DEV][SIM_MIG_MAX_GI];

#define MIG_ON(d)                                                                   \
    do {                                                                            \
        DEV(d);                                                                     \
        if (!sim->mig[(d)->index].mode) return NVML_ERROR_NOT_SUPPORTED;            \
    } while (0)

static struct sim_mig_gi *gi_of(nvmlGpuInstance_t g)
{
    if (!g_inited || sim_open() != 0 || !g) return NULL;
    if (g < &g_gis[0][0] || g > &g_gis[SIM_MAX_DEV - 1][SIM_MIG_MAX_GI - 1] || (unsigned)g->dev >= sim->ndev) return NULL;
    struct sim_mig_gi *gi = &sim->mig[g->dev].gi[g->slot];
    return gi->in_use ? gi : NULL;
}
static struct sim_mig_gi *ci_of(nvmlComputeInstance_t c)
{
    if (!g_inited || sim_open() != 0 || !c) return NULL;
    if (c < &g_cis[0][0] || c > &g_cis[SIM_MAX_DEV - 1][SIM_MIG_MAX_GI - 1] || (unsigned)c->dev >= sim->ndev) return NULL;
    struct sim_mig_gi *gi = &sim->mig[c->dev].gi[c->slot];
    return gi->in_use && gi->ci_in_use ? gi : NULL;
}
static struct sim_mig_gi *mig_of(nvmlDevice_t d)
{
    if (!g_inited || sim_open() != 0 || !d) return NULL;
    if (d < &g_migs[0][0] || d > &g_migs[SIM_MAX_DEV - 1][SIM_MIG_MAX_GI - 1] || (unsigned)d->index >= sim->ndev) return NULL;
    struct sim_mig_gi *gi = &sim->mig[d->index].gi[d->mig];
    return gi->in_use && gi->ci_in_use ? gi : NULL;
}

static const struct sim_mig_profile *by_nvml_profile(int dev, unsigned profile)
{
    unsigned n;
    const struct sim_mig_profile *t = sim_mig_table(sim->mig[dev].table, &n);
    for (unsigned i = 0; i < n; i++)
        if (t[i].nvml_profile == profile) return &t[i];
    return NULL;
}
static const struct sim_mig_profile *by_id(int dev, unsigned id, unsigned *index)
{
    unsigned n;
    const struct sim_mig_profile *t = sim_mig_table(sim->mig[dev].table, &n);
    for (unsigned i = 0; i < n; i++)
        if (t[i].id == id) {
            if (index) *index = i;
            return &t[i];
        }
    return NULL;
}

static int mig_handle_uuid(nvmlDevice_t d, char *out, unsigned len)
{
    struct sim_mig_gi *gi = mig_of(d);
    if (!gi) return -1;
    sim_mig_uuid(d->index, gi->serial, out, len);
    return 0;
}
static int mig_handle_memory(nvmlDevice_t d, nvmlMemory_t *m)
{
    struct sim_mig_gi *gi = mig_of(d);
    if (!gi) return -1;
    m->total = sim_mig_profile_of(d->index, gi)->memory_mib << 20;
    m->used = __atomic_load_n(&gi->used, __ATOMIC_RELAXED);
    m->free = m->used < m->total ? m->total - m->used : 0;
    return 0;
}
static nvmlReturn_t nvml_mig_by_uuid(const char *uuid, nvmlDevice_t *d)
{
    char s[96];
    for (unsigned i = 0; uuid && i < sim->ndev; i++)
        for (int g = 0; g < SIM_MIG_MAX_GI; g++) {
            struct sim_mig_gi *gi = &sim->mig[i].gi[g];
            if (!gi->in_use || !gi->ci_in_use || sim_visible_ordinal((int)i) < 0) continue;
            sim_mig_uuid((int)i, gi->serial, s, sizeof s);
            if (strcmp(s, uuid) == 0) {
                g_migs[i][g] = (struct nvmlDevice_st){(int)i, g};
                *d = &g_migs[i][g];
                return NVML_SUCCESS;
            }
        }
    return NVML_ERROR_NOT_FOUND;
}

/* What `nvidia-smi -i N -mig 1` calls: the operator's tool, never the plugin's. As on a GPU with
 * nothing running, the mode changes at once; with instances or processes holding memory it is
 * refused (a real GPU leaves it pending until a reset, which the simulator has no use for). */
SIM_API nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t d, unsigned int mode, nvmlReturn_t *activation)
{
    DEV(d);
    if (mode > 1 || !activation) return NVML_ERROR_INVALID_ARGUMENT;
    sim_reap();
    sim_robust_lock(&sim->lock.m);
    nvmlReturn_t rc = __atomic_load_n(&sim->dev[d->index].used, __ATOMIC_RELAXED) ? NVML_ERROR_IN_USE : NVML_SUCCESS;
    for (int g = 0; rc == NVML_SUCCESS && g < SIM_MIG_MAX_GI; g++)
        if (sim->mig[d->index].gi[g].in_use) rc = NVML_ERROR_IN_USE;
    if (rc == NVML_SUCCESS) sim->mig[d->index].mode = mode;
    pthread_mutex_unlock(&sim->lock.m);
    *activation = rc;
    return rc;
}

SIM_API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending)
{
    DEV(d);
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = sim->mig[d->index].mode;
    return NVML_SUCCESS;
}

static void fill_profile(const struct sim_mig_profile *p, nvmlGpuInstanceProfileInfo_t *i)
{
    *i = (nvmlGpuInstanceProfileInfo_t){p->id, 0, p->compute_slices, p->instances, p->sms, p->copy_engines,
                                        p->decoders, p->encoders, p->jpegs, p->ofas, p->memory_mib};
}
SIM_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int profile, nvmlGpuInstanceProfileInfo_t *info)
{
    MIG_ON(d);
    if (!info || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_mig_profile *p = by_nvml_profile(d->index, profile);
    if (!p) return NVML_ERROR_NOT_SUPPORTED;
    fill_profile(p, info);
    return NVML_SUCCESS;
}
static nvmlReturn_t profile_v2(const struct sim_mig_profile *p, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    if (!p) return NVML_ERROR_NOT_SUPPORTED;
    nvmlGpuInstanceProfileInfo_t v1;
    fill_profile(p, &v1);
    memcpy(&info->id, &v1, offsetof(nvmlGpuInstanceProfileInfo_t, memorySizeMB)); /* the ten counts */
    info->memorySizeMB = v1.memorySizeMB;
    snprintf(info->name, sizeof info->name, "%s", p->name);
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned int profile, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    MIG_ON(d);
    if (!info || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    return profile_v2(by_nvml_profile(d->index, profile), info);
}
SIM_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t d, unsigned int id, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    MIG_ON(d);
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    return profile_v2(by_id(d->index, id, NULL), info);
}

/* every placement of the profile, whether taken or not (as NVML's call documents) */
SIM_API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t d, unsigned int id,
                                                                   nvmlGpuInstancePlacement_t *out, unsigned int *count)
{
    MIG_ON(d);
    const struct sim_mig_profile *p = by_id(d->index, id, NULL);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!p) return NVML_ERROR_NOT_SUPPORTED;
    unsigned n = (unsigned)__builtin_popcount(p->starts);
    if (!out) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned k = 0;
    for (unsigned s = 0; s < SIM_MIG_SLICES; s++)
        if (p->starts & (1u << s)) out[k++] = (nvmlGpuInstancePlacement_t){s, p->size};
    *count = n;
    return NVML_SUCCESS;
}

/* under sim->lock: whether the profile at `start` fits beside the GPU's instances */
static nvmlReturn_t fits_locked(int dev, const struct sim_mig_profile *p, unsigned start)
{
    unsigned made = 0;
    for (int g = 0; g < SIM_MIG_MAX_GI; g++) {
        struct sim_mig_gi *gi = &sim->mig[dev].gi[g];
        if (!gi->in_use) continue;
        const struct sim_mig_profile *q = sim_mig_profile_of(dev, gi);
        if (q == p) made++;
        if (start < gi->start + q->size && gi->start < start + p->size) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    return made < p->instances ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_RESOURCES;
}

SIM_API nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t d, unsigned int id, unsigned int *count)
{
    MIG_ON(d);
    const struct sim_mig_profile *p = by_id(d->index, id, NULL);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!p) return NVML_ERROR_NOT_SUPPORTED;
    /* greedily, lowest placements first, as NVML counts them */
    sim_robust_lock(&sim->lock.m);
    unsigned n = 0, taken = 0;
    for (unsigned s = 0; s < SIM_MIG_SLICES; s++) {
        if (!(p->starts & (1u << s)) || fits_locked(d->index, p, s) != NVML_SUCCESS) continue;
        unsigned span = ((1u << p->size) - 1u) << s;
        if (taken & span) continue;
        taken |= span;
        n++;
    }
    unsigned made = 0;
    for (int g = 0; g < SIM_MIG_MAX_GI; g++)
        made += sim->mig[d->index].gi[g].in_use && sim_mig_profile_of(d->index, &sim->mig[d->index].gi[g]) == p;
    pthread_mutex_unlock(&sim->lock.m);
    *count = n < p->instances - made ? n : p->instances - made;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_gi(nvmlDevice_t d, unsigned id, const nvmlGpuInstancePlacement_t *want, nvmlGpuInstance_t *out)
{
    unsigned index;
    const struct sim_mig_profile *p = by_id(d->index, id, &index);
    if (!p) return NVML_ERROR_NOT_SUPPORTED;
    if (want && (want->start >= SIM_MIG_SLICES || !(p->starts & (1u << want->start)) || want->size != p->size))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_mig *m = &sim->mig[d->index];
    sim_robust_lock(&sim->lock.m);
    nvmlReturn_t rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned start = 0;
    for (unsigned s = 0; s < SIM_MIG_SLICES && rc != NVML_SUCCESS; s++) {
        if (want ? s != want->start : !(p->starts & (1u << s))) continue;
        rc = fits_locked(d->index, p, s);
        start = s;
    }
    int slot = -1;
    for (int g = 0; rc == NVML_SUCCESS && g < SIM_MIG_MAX_GI && slot < 0; g++)
        if (!m->gi[g].in_use) slot = g;
    if (rc == NVML_SUCCESS && slot < 0) rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (rc == NVML_SUCCESS) {
        unsigned id_taken = 0;
        for (int g = 0; g < SIM_MIG_MAX_GI; g++)
            if (m->gi[g].in_use) id_taken |= 1u << m->gi[g].id;
        unsigned gi_id = 1;
        while (id_taken & (1u << gi_id)) gi_id++;
        m->gi[slot] = (struct sim_mig_gi){.in_use = 1, .id = gi_id, .profile = index, .start = start,
                                          .serial = ++m->serial};
        g_gis[d->index][slot] = (struct nvmlGpuInstance_st){d->index, slot};
        *out = &g_gis[d->index][slot];
    }
    pthread_mutex_unlock(&sim->lock.m);
    return rc;
}
SIM_API nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned int id,
                                                              const nvmlGpuInstancePlacement_t *placement,
                                                              nvmlGpuInstance_t *gi)
{
    MIG_ON(d);
    if (!placement || !gi) return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(d, id, placement, gi);
}
SIM_API nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *gi)
{
    MIG_ON(d);
    if (!gi) return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(d, id, NULL, gi);
}

SIM_API nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t g)
{
    struct sim_mig_gi *gi = gi_of(g);
    if (!gi) return NVML_ERROR_INVALID_ARGUMENT;
    sim_robust_lock(&sim->lock.m);
    nvmlReturn_t rc = gi->ci_in_use ? NVML_ERROR_IN_USE : NVML_SUCCESS;
    if (rc == NVML_SUCCESS) memset(gi, 0, sizeof *gi);
    pthread_mutex_unlock(&sim->lock.m);
    return rc;
}

SIM_API nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *out, unsigned int *count)
{
    MIG_ON(d);
    if (!out || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!by_id(d->index, id, NULL)) return NVML_ERROR_NOT_SUPPORTED;
    unsigned n = 0;
    for (int g = 0; g < SIM_MIG_MAX_GI; g++) {
        struct sim_mig_gi *gi = &sim->mig[d->index].gi[g];
        if (!gi->in_use || sim_mig_profile_of(d->index, gi)->id != id) continue;
        g_gis[d->index][g] = (struct nvmlGpuInstance_st){d->index, g};
        out[n++] = &g_gis[d->index][g];
    }
    *count = n;
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *out)
{
    MIG_ON(d);
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    for (int g = 0; g < SIM_MIG_MAX_GI; g++) {
        struct sim_mig_gi *gi = &sim->mig[d->index].gi[g];
        if (gi->in_use && gi->id == id) {
            g_gis[d->index][g] = (struct nvmlGpuInstance_st){d->index, g};
            *out = &g_gis[d->index][g];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

SIM_API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t g, nvmlGpuInstanceInfo_t *info)
{
    struct sim_mig_gi *gi = gi_of(g);
    if (!gi || !info) return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_mig_profile *p = sim_mig_profile_of(g->dev, gi);
    *info = (nvmlGpuInstanceInfo_t){&g_devs[g->dev], gi->id, p->id, {gi->start, p->size}};
    return NVML_SUCCESS;
}

/* Compute instances: the one profile that spans the whole GPU instance
 * (NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE = 0..4, its ID equal to its index) */
static int ci_profile_for(unsigned compute_slices)
{
    static const unsigned slices[] = {1, 2, 3, 4, 7};
    for (int i = 0; i < 5; i++)
        if (slices[i] == compute_slices) return i;
    return -1;
}
static nvmlReturn_t ci_profile_info(nvmlGpuInstance_t g, unsigned profile, nvmlComputeInstanceProfileInfo_t *info)
{
    struct sim_mig_gi *gi = gi_of(g);
    if (!gi || !info || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_mig_profile *p = sim_mig_profile_of(g->dev, gi);
    if ((int)profile != ci_profile_for(p->compute_slices)) return NVML_ERROR_NOT_SUPPORTED;
    *info = (nvmlComputeInstanceProfileInfo_t){profile, p->compute_slices, 1, p->sms, p->copy_engines,
                                               p->decoders, p->encoders, p->jpegs, p->ofas};
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t g, unsigned int profile,
                                                                 unsigned int engines,
                                                                 nvmlComputeInstanceProfileInfo_t *info)
{
    if (engines != 0) return NVML_ERROR_INVALID_ARGUMENT; /* NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED only */
    return ci_profile_info(g, profile, info);
}
SIM_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t g, unsigned int profile,
                                                                  unsigned int engines,
                                                                  nvmlComputeInstanceProfileInfo_v2_t *info)
{
    if (engines != 0 || !info) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlComputeInstanceProfileInfo_t v1;
    nvmlReturn_t rc = ci_profile_info(g, profile, &v1);
    if (rc != NVML_SUCCESS) return rc;
    unsigned version = info->version;
    memcpy(&info->id, &v1, sizeof v1);
    info->version = version;
    snprintf(info->name, sizeof info->name, "MIG %uc.%s", v1.sliceCount,
             sim_mig_profile_of(g->dev, gi_of(g))->name + 4);
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t g, unsigned int profile,
                                                         nvmlComputeInstance_t *out)
{
    struct sim_mig_gi *gi = gi_of(g);
    if (!gi || !out || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if ((int)profile != ci_profile_for(sim_mig_profile_of(g->dev, gi)->compute_slices))
        return NVML_ERROR_NOT_SUPPORTED;
    sim_robust_lock(&sim->lock.m);
    nvmlReturn_t rc = gi->ci_in_use ? NVML_ERROR_INSUFFICIENT_RESOURCES : NVML_SUCCESS;
    if (rc == NVML_SUCCESS) {
        gi->ci_in_use = 1;
        gi->ci_id = 0;
        gi->used = 0;
        g_cis[g->dev][g->slot] = (struct nvmlComputeInstance_st){g->dev, g->slot};
        *out = &g_cis[g->dev][g->slot];
    }
    pthread_mutex_unlock(&sim->lock.m);
    return rc;
}

SIM_API nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t g, unsigned int profile,
                                                       nvmlComputeInstance_t *out, unsigned int *count)
{
    struct sim_mig_gi *gi = gi_of(g);
    if (!gi || !out || !count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    if (gi->ci_in_use && (int)profile == ci_profile_for(sim_mig_profile_of(g->dev, gi)->compute_slices)) {
        g_cis[g->dev][g->slot] = (struct nvmlComputeInstance_st){g->dev, g->slot};
        out[0] = &g_cis[g->dev][g->slot];
        *count = 1;
    }
    return NVML_SUCCESS;
}

/* a compute instance whose processes still hold memory is in use */
SIM_API nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t c)
{
    struct sim_mig_gi *gi = ci_of(c);
    if (!gi) return NVML_ERROR_INVALID_ARGUMENT;
    sim_reap();
    sim_robust_lock(&sim->lock.m);
    nvmlReturn_t rc = __atomic_load_n(&gi->used, __ATOMIC_RELAXED) ? NVML_ERROR_IN_USE : NVML_SUCCESS;
    if (rc == NVML_SUCCESS) gi->ci_in_use = 0;
    pthread_mutex_unlock(&sim->lock.m);
    return rc;
}

SIM_API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t c, nvmlComputeInstanceInfo_t *info)
{
    struct sim_mig_gi *gi = ci_of(c);
    if (!gi || !info) return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_mig_profile *p = sim_mig_profile_of(c->dev, gi);
    *info = (nvmlComputeInstanceInfo_t){&g_devs[c->dev], &g_gis[c->dev][c->slot], gi->ci_id,
                                        (unsigned)ci_profile_for(p->compute_slices), {0, p->compute_slices}};
    g_gis[c->dev][c->slot] = (struct nvmlGpuInstance_st){c->dev, c->slot};
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count)
{
    DEV(d);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = sim->mig[d->index].mode ? 7 : 0;
    return NVML_SUCCESS;
}

/* the index-th MIG device (a GPU instance with its compute instance) */
SIM_API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *out)
{
    MIG_ON(d);
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned k = 0;
    for (int g = 0; g < SIM_MIG_MAX_GI; g++) {
        struct sim_mig_gi *gi = &sim->mig[d->index].gi[g];
        if (!gi->in_use || !gi->ci_in_use || k++ != index) continue;
        g_migs[d->index][g] = (struct nvmlDevice_st){d->index, g};
        *out = &g_migs[d->index][g];
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}

SIM_API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig)
{
    if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (mig_of(d)) {
        *is_mig = 1;
        return NVML_SUCCESS;
    }
    DEV(d);
    *is_mig = 0;
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id)
{
    struct sim_mig_gi *gi = mig_of(d);
    if (!gi || !id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = gi->id;
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id)
{
    struct sim_mig_gi *gi = mig_of(d);
    if (!gi || !id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = gi->ci_id;
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent)
{
    if (!mig_of(d) || !parent) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = &g_devs[d->index];
    return NVML_SUCCESS;
}
