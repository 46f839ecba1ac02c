/* Shared usage region: one file per (claim, GPU), REGION_SIZE bytes, mapped by every process
 * that shares the claim. Holds usage only, never limits. Layout documented in hook/README.md. */
#ifndef GPUSHARE_REGION_H
#define GPUSHARE_REGION_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define GS_REGION_SIZE (1u << 20)               /* 1 MiB, as created by the kubelet plugin */
#define GS_REGION_MAGIC 0x31474552534750ULL     /* "PGSREG1" little endian */
#define GS_REGION_VERSION 1u
#define GS_HEADER_SIZE 4096u
#define GS_SLOT_SIZE 64u
#define GS_SLOT_COUNT ((GS_REGION_SIZE - GS_HEADER_SIZE) / GS_SLOT_SIZE) /* 16320 */

struct gs_region_header {
    uint64_t magic;          /*   0: GS_REGION_MAGIC, written last when initialising */
    uint32_t version;        /*   8: GS_REGION_VERSION */
    uint32_t header_size;    /*  12: GS_HEADER_SIZE */
    uint32_t slot_size;      /*  16: GS_SLOT_SIZE */
    uint32_t slot_count;     /*  20: GS_SLOT_COUNT */
    uint32_t region_size;    /*  24: GS_REGION_SIZE */
    uint32_t holder;         /*  28: slot + 1 of the process inside the lock, 0 = none (was reserved) */
    union {                  /*  32: process-shared robust mutex guarding used/slots */
        pthread_mutex_t m;
        uint8_t pad[64];
    } lock;
    uint64_t used;           /*  96: bytes reserved by all slots (sum of slot.used), kept for
                                     readers; never trusted by the library (see region.c) */
    uint32_t slots_hw;       /* 104: slots [0, slots_hw) have been used at least once */
    uint32_t lock_seq;       /* 108: bumped by every lock holder: waiters see the lock move (was reserved) */
    uint64_t reaped;         /* 112: number of dead slots reclaimed (diagnostics) */
    /* compute pacing, lock-free (atomics) */
    uint64_t pace_tat_ns;    /* 120: token bucket as GCRA "theoretical arrival time", CLOCK_MONOTONIC ns */
    uint32_t pace_rate_ppm;  /* 128: refill rate, millionths of the GPU; 0 = derive from the
                                     compute limit. A node agent may write it (Hard policy: the
                                     library never exceeds the claim's limit whatever it says) */
    uint32_t pace_kernel_us; /* 132: the longest launch the library booked since the node agent last
                                     zeroed it, us (atomic max); the agent sizes the slot period by it */
    uint64_t pace_gpu_ns;    /* 136: estimated GPU time charged to the claim (diagnostics) */
    /* counters for the node agent's metrics: atomic adds, zero in a fresh region */
    uint64_t paced_ns;       /* 144: wall time launches slept to hold the compute share */
    uint64_t oom_refusals;   /* 152: allocations refused because the claim was at its limit */
    /* the turn of a claim's time-sliced processes in its slot (pacing.c, turn_take): one word,
     * compare-and-swap only: the holder's token << 40 | when the turn lapses (CLOCK_MONOTONIC ns
     * >> 10); token 0 = given back, its holder's work ending then */
    uint64_t pace_turn;      /* 160 */
    uint64_t pace_qend_ns;   /* 168: when the claim's queued work ends as its last launching process
                                     predicts it (CLOCK_MONOTONIC): the agent's relay tells a Burst
                                     claim that fills the GPU behind this one (pacing.c, fill_turn) */
};

struct gs_slot {
    uint32_t in_use;         /*  0: 1 = owned by a live (or not yet reaped) process */
    int32_t pid;             /*  4: pid as seen in the owner's pid namespace */
    uint64_t start_time;     /*  8: /proc/self/stat field 22 of the owner (pid reuse) */
    uint64_t pidns;          /* 16: inode of the owner's /proc/self/ns/pid */
    uint64_t used;           /* 24: bytes this process holds on this GPU */
    uint8_t pad[32];         /* 32 */
};

_Static_assert(sizeof(struct gs_region_header) <= GS_HEADER_SIZE, "header too big");
_Static_assert(sizeof(pthread_mutex_t) <= 64, "mutex too big");
_Static_assert(sizeof(struct gs_slot) == GS_SLOT_SIZE, "slot size");
_Static_assert(__builtin_offsetof(struct gs_region_header, holder) == 28, "layout");
_Static_assert(__builtin_offsetof(struct gs_region_header, used) == 96, "layout");
_Static_assert(__builtin_offsetof(struct gs_region_header, pace_rate_ppm) == 128, "layout");
_Static_assert(__builtin_offsetof(struct gs_region_header, pace_kernel_us) == 132, "layout");
_Static_assert(__builtin_offsetof(struct gs_region_header, paced_ns) == 144, "layout");
_Static_assert(__builtin_offsetof(struct gs_region_header, oom_refusals) == 152, "layout");
_Static_assert(__builtin_offsetof(struct gs_region_header, pace_turn) == 160, "layout");
_Static_assert(__builtin_offsetof(struct gs_region_header, pace_qend_ns) == 168, "layout");

/* Per-process view of one region. The region is tenant-writable: what this process holds is
 * kept here too (`mine`), and the shared lock is waited for at most GS_LOCK_WAIT_NS. */
#define GS_LOCK_WAIT_NS 100000000ull   /* a lock that does not move: refused after 100 ms */
#define GS_STUCK_NS 80000000ull        /* not moving this long: break it if nobody live is inside */
#define GS_LOCK_SLICE_NS 20000000ull   /* waits are sliced to watch the lock move */
/* Refused this much before GS_LOCK_WAIT_NS: a timed wait ends when the waiter runs again, which
 * on a busy CPU is up to one scheduler slice plus a tick after its timer (EEVDF: 3 ms base slice
 * on 8 or more CPUs, a 4 ms tick at HZ=250: 7 ms). Measured: 5.8 ms late with 12 busy loops on the
 * waiter's CPU (hook/README.md); 2 ms (a 2 % margin) read 104 ms there. */
#define GS_LOCK_SLACK_NS 10000000ull
#define GS_LOCK_BUSY_NS 1000000000ull  /* a lock that keeps moving (contention): waited at most 1 s */
#define GS_LOCK_BREAK_NS 1000000000ull /* a live holder keeping it unmoved this long is stopped */
enum { GS_LOG_USED, GS_LOG_SLOT, GS_LOG_WEDGED, GS_LOG_LOCK, GS_LOG_KINDS };
struct gs_lock_view { /* what a waiter sees of the lock; any change means it moves */
    uint32_t word, holder, seq;
};
struct gs_region {
    struct gs_region_header *hdr;
    struct gs_slot *slots;
    int lock_fd;            /* O_CLOEXEC fd whose OFD lock on our slot's byte says "alive" */
    int slot;               /* our slot, -1 = not registered yet */
#ifdef GS_TEST_FAULTS
    int fault_stop;         /* test builds only (hook/Makefile): SIGSTOP while holding the lock */
    int fault_spin_ms;      /* test builds only: run (state R) this long while holding the lock */
#endif
    struct gs_lock_view stuck; /* a live holder seen keeping the lock unmoved, since: */
    uint64_t stuck_since;
    uint64_t mine;          /* bytes this process holds: the truth for our slot (under pub) */
    uint32_t hw_seen;       /* highest slots_hw this process has seen (it never legitimately falls) */
    pthread_mutex_t local;  /* one thread of this process at a time in the shared lock */
    pthread_mutex_t pub;    /* guards mine and its copy in our slot; never held across a wait */
    __pthread_list_t saved_list; /* the mutex's robust-list links as glibc set them (see region.c) */
    int saved_kind;
    int saved_owner;
    int resync;             /* a holder died inside: rewrite `used` at the next recount (under the lock) */
    uint64_t last_reap_ns;
    uint64_t waited_ns, unmoved_ns; /* the last refused wait: how long, and the lock unmoved for */
    char holder_state;      /* and its holder's state as /proc showed it ('?': not visible) */
    uint64_t last_log_ns[GS_LOG_KINDS]; /* repairs are logged at most once per 10 s each */
    uint64_t unlogged[GS_LOG_KINDS];
    char path[4096];        /* "" = anonymous, per-process accounting */
};

/* Map (and if zero-filled, initialise) the region at path; NULL path = private anonymous
 * region. Returns 0, or -1 after one log line (corrupt, unknown version, cannot open). */
int gs_region_open(struct gs_region *r, const char *path);
/* Reserve size bytes if the claim's total (the sum of live slots) stays <= limit.
 * 0 = reserved, -1 = refused (over the limit, or the lock is held for over 100 ms by a live
 * process). Never waits longer than GS_LOCK_WAIT_NS. */
int gs_region_reserve(struct gs_region *r, uint64_t size, uint64_t limit);
/* Never waits: only this process writes its own slot. */
void gs_region_release(struct gs_region *r, uint64_t size);
/* The claim's usage as the sum of live slots, read without the lock (never blocks). */
uint64_t gs_region_used(struct gs_region *r, uint64_t limit);
/* Reclaim slots of dead processes, at most once per min_interval_ns; skipped (never waits)
 * when the lock is busy. */
void gs_region_reap(struct gs_region *r, uint64_t min_interval_ns);
/* In a fork child: forget the parent's slot (re-registered on the next reservation). */
void gs_region_forget_slot(struct gs_region *r);
uint64_t gs_now_ns(void);

#endif
