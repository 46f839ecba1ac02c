/* Simulated GPUs shared by every process that opens the same state file
 * (GPUSHARE_SIM_STATE): memory in use, a serial kernel timeline, per-process usage. */
#ifndef GPUSHARE_SIM_STATE_H
#define GPUSHARE_SIM_STATE_H

#include <pthread.h>
#include <stdint.h>

#define SIM_MAX_DEV 8
#define SIM_MAX_PROC 256
#define SIM_MAGIC 0x324d495350475347ULL /* "GSGPSIM2" */
#define SIM_API __attribute__((visibility("default")))

struct sim_dev {
    uint64_t total;
    uint64_t used;          /* atomic */
    uint64_t busy_until_ns; /* atomic: the device runs kernels one after another */
    uint64_t busy_total_ns; /* atomic: GPU time of every kernel ever scheduled */
};

struct sim_proc {
    uint32_t in_use;
    int32_t pid;                   /* in the process's own pid namespace */
    uint64_t start_ns;
    uint64_t pidns;                /* inode of that namespace: NVML answers the caller's pids */
    uint64_t used[SIM_MAX_DEV];    /* atomic */
    uint64_t busy_ns[SIM_MAX_DEV]; /* atomic */
};

struct sim_state {
    uint64_t magic;
    uint32_t ndev, pad;
    union { pthread_mutex_t m; char pad[64]; } lock; /* robust, guards proc[] */
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
void sim_mem_unreserve(int dev, uint64_t size);
uint64_t sim_busy_done(int dev, uint64_t now); /* GPU ns of kernels finished by now */

#endif
