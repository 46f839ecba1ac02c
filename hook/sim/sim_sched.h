/* The simulated GPU's scheduler (sim_sched.c): its types, which the shared state embeds
 * (sim_state.h), and its calls. The scheduler depends on the state (it reads the shared
 * `sim`); the state never calls the scheduler: it only embeds these types and initialises them
 * with sim_sched_init() below, so the two files are no circle. */
#ifndef GPUSHARE_SIM_SCHED_H
#define GPUSHARE_SIM_SCHED_H

#include <pthread.h>
#include <stdint.h>

#include "../src/robust_mutex.h"

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
    uint32_t preempted;   /* its context lost the device with work left, and has not had it back */
    uint32_t pad;
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
    uint64_t switch_end;  /* a context switch is under way until here: nothing runs */
    uint64_t boundaries;  /* slice ends at which a context waited: picks who waits a second slice */
    uint64_t busy_ns;     /* GPU ns executed, all processes */
    uint64_t next_sample; /* next NVML sample instant */
    uint64_t sample_busy; /* busy_ns at the previous sample instant */
    uint32_t nsamples, pad;
    struct sim_sample samples[SIM_SAMPLES];
};

static inline void sim_sched_init(struct sim_sched *s)
{
    gs_robust_mutex_init(&s->lock.m);
    s->resident = -1;
}

/* one queue per process and device. Position (queued_ns) after the work; demand_ppm: share of
 * the SMs its kernels ask for, 0 = as the work before it */
uint64_t sim_enqueue(int dev, uint64_t ns, uint32_t demand_ppm);
/* an event: timestamped. Its watch is one of a ring of SIM_WATCHES: *evicted gets what the slot
 * held before ({time reached or 0, position}), for the caller to hand to that slot's event */
uint64_t sim_enqueue_watched(int dev, uint64_t ns, uint32_t *watch, struct sim_seg *evicted);
uint64_t sim_position(int dev);                     /* queued_ns now */
int sim_done(int dev, uint64_t pos);                /* 1 if the work up to pos has executed */
void sim_wait(int dev, uint64_t pos);               /* until it has */
uint64_t sim_pos_time(int dev, uint64_t pos, uint32_t watch, uint64_t floor); /* when pos completed (done only) */
uint64_t sim_busy_done(int dev);                    /* GPU ns of kernels executed so far */
/* NVML: per-process (proc[] slot) mean utilization over samples newer than since_us; returns
 * entries written */
unsigned sim_samples(int dev, uint64_t since_us, int32_t *slots, unsigned *util, uint64_t *last_us, unsigned max);

#endif
