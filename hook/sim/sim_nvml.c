/* Simulated NVML (libnvidia-ml.so.1) over the same state as the simulated driver. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "../src/cuda_abi.h"
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
SIM_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    DEV(d);
    char s[96];
    sim_uuid_string(d->index, s, sizeof s);
    return copy_str(uuid, len, s);
}
SIM_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) { DEV(d); return copy_str(name, len, "NVIDIA Simulated GPU"); }
SIM_API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch) { DEV(d); *arch = 9; /* Hopper */ return NVML_SUCCESS; }
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

static nvmlReturn_t running(nvmlDevice_t d, unsigned int *count, void *infos, size_t stride)
{
    DEV(d);
    struct sim_proc *ps[SIM_MAX_PROC];
    unsigned n = procs_on(d->index, ps, SIM_MAX_PROC);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!infos || *count < n) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned i = 0; i < n; i++) {
        nvmlProcessInfo_t info = {(unsigned)ps[i]->pid, __atomic_load_n(&ps[i]->used[d->index], __ATOMIC_RELAXED),
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
    uint64_t now = sim_now_ns(), busy = sim_busy_done(i, now);
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
    int32_t pids[SIM_SAMPLES];
    unsigned util[SIM_SAMPLES];
    uint64_t newest;
    unsigned n = sim_samples(d->index, last_seen, pids, util, &newest, SIM_SAMPLES);
    if (n == 0) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!s || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++)
        s[i] = (nvmlProcessUtilizationSample_t){(unsigned)pids[i], newest, util[i], 0, 0, 0};
    *count = n;
    return NVML_SUCCESS;
}
