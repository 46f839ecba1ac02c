/* Simulated GPUs shared by every process that opens the same state file
 * (GPUSHARE_SIM_STATE): memory in use, a time-sliced kernel scheduler (sim_sched.c),
 * per-process usage and NVML's utilization samples. */
#ifndef GPUSHARE_SIM_STATE_H
#define GPUSHARE_SIM_STATE_H

#include <pthread.h>
#include <stdint.h>

#include "../src/robust_mutex.h"

#define SIM_MAX_DEV 8
#define SIM_MAX_PROC 256
#define SIM_MAGIC 0x344d495350475347ULL /* "GSGPSIM4" */
#define SIM_API __attribute__((visibility("default")))

/* ---- time slicing and MPS (sim_sched.c) ---- */
#define SIM_SEGMENTS 32   /* per (process, device): recent stretches of running, for event times */
#define SIM_SAMPLES 64    /* per device: NVML utilization samples kept (12.8 s at 200 ms) */
#define SIM_DEMANDS 16    /* per (process, device): changes of SM demand queued */
#define SIM_FULL 1000000u /* ppm: all of the GPU's SMs; a rate of one GPU-ns per ns */
#define SIM_SM_COUNT 132  /* an H100 SXM's: a kernel of this many blocks asks for every SM */

/* from t0 the process ran at ppm GPU-ns per ns (time slicing: SIM_FULL), done counter at done0 */
struct sim_seg { uint64_t t0, done0; uint32_t ppm, pad; };
/* queued work from position `from` on asks for `ppm` of the SMs (the kernels' grid size) */
struct sim_demand { uint64_t from; uint32_t ppm, pad; };

#define SIM_WATCHES 32 /* per (process, device): recorded events the schedule timestamps */

struct sim_queue {        /* one process's work on one device; under the device's sched lock */
    uint64_t queued_ns;   /* GPU ns ever enqueued (kernel lengths) */
    uint64_t done_ns;     /* GPU ns ever executed */
    uint32_t nseg, nwatch;
    uint32_t run_ppm;     /* the rate it runs at now; 0 not running */
    uint32_t ndemand;
    struct sim_demand demand[SIM_DEMANDS];
    struct sim_seg seg[SIM_SEGMENTS];
    struct sim_seg watch[SIM_WATCHES]; /* {time reached (0: not yet), position} */
};

struct sim_sample { uint64_t t_us; int32_t slot; uint32_t util; }; /* realtime us, resident proc[] slot */

struct sim_sched {
    union { pthread_mutex_t m; char pad[64]; } lock; /* robust, process-shared */
    uint64_t t;           /* the schedule is computed up to this time (CLOCK_MONOTONIC ns) */
    int32_t resident;     /* proc index whose context (an MPS server: any client) holds the device; -1 none */
    int32_t pad0;
    uint64_t slice_end;   /* the resident's time slice ends here */
    uint64_t busy_ns;     /* GPU ns executed, all processes */
    uint64_t next_sample; /* next NVML sample instant */
    uint64_t sample_busy; /* busy_ns at the previous sample instant */
    uint32_t nsamples, pad;
    struct sim_sample samples[SIM_SAMPLES];
};

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
    struct sim_queue q[SIM_MAX_DEV];
};

struct sim_state {
    uint64_t magic;
    uint32_t ndev, pad;
    union { pthread_mutex_t m; char pad[64]; } lock; /* robust, guards proc[] */
    uint64_t slice_ns;         /* GPUSHARE_SIM_SLICE_US when the state was created */
    uint64_t sample_ns;        /* GPUSHARE_SIM_NVML_SAMPLE_MS when the state was created */
    uint32_t proc_hw, pad2;    /* proc[] entries [0, proc_hw) have been used: the scheduler looks no further */
    struct sim_dev dev[SIM_MAX_DEV];
    struct sim_proc proc[SIM_MAX_PROC];
};

extern struct sim_state *sim;       /* NULL until sim_open() */
extern struct sim_proc *sim_me;     /* this process's entry */
extern uint64_t sim_kernel_ns;      /* GPUSHARE_SIM_KERNEL_US */
extern char sim_uuid_prefix[64];

int sim_open(void);                 /* 0 on success; once per process (again after fork) */
uint64_t sim_pidns(void);           /* inode of this process's pid namespace, 0 if unknown */
uint64_t sim_now_ns(void);
void sim_sleep_until(uint64_t t);
void sim_uuid_bytes(int dev, unsigned char out[16]);
void sim_uuid_string(int dev, char *out, unsigned len);
int sim_mem_reserve(int dev, uint64_t size);  /* 0 ok, -1 out of memory */
int sim_ctx_claim(int dev);                   /* 0: this process may hold a context on dev; -1 not (compute mode) */
void sim_mem_unreserve(int dev, uint64_t size);
uint64_t sim_busy_done(int dev, uint64_t now); /* GPU ns of kernels finished by now */
void sim_robust_lock(pthread_mutex_t *m);
void sim_reap(void);                /* give back what dead processes held (NVML queries) */

/* time-sliced scheduler with MPS servers (sim_sched.c): one queue per process and device */
void sim_sched_init(struct sim_sched *s);
/* position (queued_ns) after the work; demand_ppm: share of the SMs its kernels ask for, 0 = as
 * the work before it */
uint64_t sim_enqueue(int dev, uint64_t ns, uint32_t demand_ppm);
uint64_t sim_enqueue_watched(int dev, uint64_t ns, uint32_t *watch); /* an event: timestamped */
uint64_t sim_position(int dev);                     /* queued_ns now */
int sim_done(int dev, uint64_t pos);                /* 1 if the work up to pos has executed */
void sim_wait(int dev, uint64_t pos);               /* until it has */
uint64_t sim_pos_time(int dev, uint64_t pos, uint32_t watch, uint64_t floor); /* when pos completed (done only) */
/* NVML: per-process (proc[] slot) mean utilization over samples newer than since_us; returns
 * entries written */
unsigned sim_samples(int dev, uint64_t since_us, int32_t *slots, unsigned *util, uint64_t *last_us, unsigned max);

#endif
