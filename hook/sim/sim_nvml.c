/* Simulated NVML (libnvidia-ml.so.1) over the same state as the simulated driver. */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../src/cuda_abi.h"
#include "../src/rawstat.h"
#include "sim_state.h"

struct nvmlDevice_st { int index; };
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
    for (int i = 0; i < SIM_MAX_DEV; i++) g_devs[i].index = i;
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

SIM_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { NEED_INIT(); *n = sim->ndev; return NVML_SUCCESS; }
SIM_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }
SIM_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    NEED_INIT();
    if (!d || i >= sim->ndev) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &g_devs[i];
    return NVML_SUCCESS;
}
SIM_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }
SIM_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
    NEED_INIT();
    char s[96];
    for (unsigned i = 0; uuid && i < sim->ndev; i++) {
        sim_uuid_string((int)i, s, sizeof s);
        if (strcmp(s, uuid) == 0) {
            *d = &g_devs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
SIM_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) { DEV(d); *i = (unsigned)d->index; return NVML_SUCCESS; }
/* The N of /dev/nvidiaN; the mock backend gives each simulated GPU its index as minor. */
SIM_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m) { DEV(d); *m = (unsigned)d->index; return NVML_SUCCESS; }
SIM_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
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

SIM_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
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

/* live processes holding memory on or having run kernels on the device */
static unsigned procs_on(int dev, struct sim_proc **out, unsigned max)
{
    unsigned n = 0;
    for (int i = 0; i < SIM_MAX_PROC; i++) {
        struct sim_proc *p = &sim->proc[i];
        if (!p->in_use || (!p->used[dev] && !p->busy_ns[dev])) continue;
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

static nvmlReturn_t running(nvmlDevice_t d, unsigned int *count, void *infos, size_t stride)
{
    DEV(d);
    struct sim_proc *ps[SIM_MAX_PROC];
    sim_reap();
    unsigned n = procs_on(d->index, ps, SIM_MAX_PROC);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!infos || *count < n) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned i = 0; i < n; i++) {
        nvmlProcessInfo_t info = {caller_pid(ps[i]), __atomic_load_n(&ps[i]->used[d->index], __ATOMIC_RELAXED),
                                  0xFFFFFFFFu, 0xFFFFFFFFu};
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

/* GPU busy share since this process's previous query (first query: since nvmlInit... or
 * since the process opened the simulator) */
SIM_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    DEV(d);
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
    DEV(d);
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
