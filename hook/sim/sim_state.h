/* Simulated GPUs shared by every process that opens the same state file
 * (GPUSHARE_SIM_STATE): memory in use, the time-sliced kernel scheduler's state (its types:
 * sim_sched.h; its code, sim_sched.c, depends on this file, never the other way), per-process
 * usage and NVML's utilization samples. */
#ifndef GPUSHARE_SIM_STATE_H
#define GPUSHARE_SIM_STATE_H

#include <pthread.h>
#include <stdint.h>

#include "../src/robust_mutex.h"
#include "sim_sched.h"
#include "sim_mig.h"

#define SIM_MAX_DEV 8
#define SIM_MAX_PROC 256
#define SIM_MAGIC 0x364d495350475347ULL /* "GSGPSIM6" */
#define SIM_API __attribute__((visibility("default")))

/* compute modes, as NVML's nvmlComputeMode_t and CUDA's CUcomputemode number them */
#define SIM_COMPUTEMODE_DEFAULT 0u
#define SIM_COMPUTEMODE_PROHIBITED 2u
#define SIM_COMPUTEMODE_EXCLUSIVE_PROCESS 3u

struct sim_dev {
    uint64_t total;
    uint64_t used;          /* atomic */
    uint32_t compute_mode;  /* nvmlDeviceSetComputeMode; decides who may hold a context */
    uint32_t pad;
    struct sim_sched sched;
};

struct sim_proc {
    uint32_t in_use;
    int32_t pid;                   /* in the process's own pid namespace */
    uint64_t start_ns;
    uint64_t pidns;                /* inode of that namespace: NVML answers the caller's pids */
    uint64_t used[SIM_MAX_DEV];    /* atomic */
    uint64_t busy_ns[SIM_MAX_DEV]; /* GPU ns executed (= q.done_ns), read by NVML */
    uint64_t mps_server;           /* MPS server it is a client of (sim_mps.h); 0 none */
    uint32_t mps_threads_ppm;      /* its active-thread share, ppm of the SMs */
    uint32_t ctx_devs;             /* devices it holds a context on (bit per device), until it exits */
    uint32_t mig_slot1, pad_mig;    /* the GPU instance slot + 1 of its MIG device (sim_mig_visible); 0 none */
    struct sim_queue q[SIM_MAX_DEV];
};

struct sim_state {
    uint64_t magic;
    uint32_t ndev, pad;
    union { pthread_mutex_t m; char pad[64]; } lock; /* robust, guards proc[] */
    /* read from the environment when the state was created (docs/interfaces.md), so that
     * every process agrees: the time slice, a context switch's cost, the share of slice ends at
     * which the waiting context waits one more slice, NVML's sample period */
    uint64_t slice_ns;         /* GPUSHARE_SIM_SLICE_US */
    uint64_t switch_ns;        /* GPUSHARE_SIM_SWITCH_US */
    uint32_t again_ppm, pad3;  /* GPUSHARE_SIM_WAIT_AGAIN_PCT */
    uint64_t sample_ns;        /* GPUSHARE_SIM_NVML_SAMPLE_MS */
    uint32_t proc_hw, pad2;    /* proc[] entries [0, proc_hw) have been used: the scheduler looks no further */
    struct sim_dev dev[SIM_MAX_DEV];
    struct sim_proc proc[SIM_MAX_PROC];
    struct sim_mig mig[SIM_MAX_DEV];  /* MIG mode and instances (sim_mig.h) */
};

extern struct sim_state *sim;       /* NULL until sim_open() */
extern struct sim_proc *sim_me;     /* this process's entry */
extern uint64_t sim_kernel_ns;      /* GPUSHARE_SIM_KERNEL_US */
extern uint64_t sim_launch_ns;      /* GPUSHARE_SIM_LAUNCH_NS: CPU time a launch costs its thread */
extern char sim_uuid_prefix[64];

int sim_open(void);                 /* 0 on success; once per process (again after fork) */
uint64_t sim_pidns(void);           /* inode of this process's pid namespace, 0 if unknown */
uint64_t sim_now_ns(void);
void sim_sleep_until(uint64_t t);
void sim_uuid_bytes(int dev, unsigned char out[16]);
void sim_uuid_parse(const char *uuid, unsigned char out[16]); /* GPU-... or MIG-... */
void sim_uuid_string(int dev, char *out, unsigned len);
int sim_mem_reserve(int dev, uint64_t size);  /* 0 ok, -1 out of memory (of the process's MIG device, if any) */
int sim_ctx_claim(int dev);                   /* 0: this process may hold a context on dev; -1 not (compute mode) */
void sim_mem_unreserve(int dev, uint64_t size);
void sim_robust_lock(pthread_mutex_t *m);
void sim_reap(void);                /* give back what dead processes held (NVML queries) */

/* The GPUs this process can open. A container gets the device nodes (/dev/nvidiaN) of its
 * claims' GPUs only, and CUDA and NVML number those from 0 inside it. The simulator has no
 * device nodes: a claim's spec names its GPUs in GPUSHARE_SIM_VISIBLE_<claim>=i,j (one variable
 * per claim, so a container of two claims sees both, as with device nodes). A process with no
 * such variable (the host: plugin, agent) sees every GPU. Ordinal: the number CUDA and NVML
 * give inside; physical: the index in sim->dev. */
unsigned sim_visible_count(void);
int sim_visible_physical(int ordinal);  /* -1: no such ordinal */
int sim_visible_ordinal(int physical);  /* -1: not visible */

#endif
