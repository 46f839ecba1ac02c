/* What does this process hold? Its state for each GPU of the claim (memory limit, usage region,
 * pacing), its pointer table, and what a fork child keeps of them (state.c). */
#ifndef GPUSHARE_STATE_H
#define GPUSHARE_STATE_H

#include <pthread.h>
#include <stdint.h>

#include "compiler.h"
#include "control.h"
#include "cuda_abi.h"
#include "limits.h"
#include "ptrmap.h"
#include "region.h"

#define COST_ENTRIES 256 /* launch costs remembered per GPU: direct-mapped by kernel/graph */

/* an event recorded after the work a process queued, and when that work should have run */
struct gs_marker {
    CUevent ev;
    int pending;               /* ev is in flight */
    uint64_t pred_ns;          /* when ev should complete, the GPU the claim's own */
};

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
    /* pacing (pacing.c): cost of a launch (GPU ns) measured with an event pair every SAMPLE_NS */
    uint64_t cost_ns[2];       /* [kernel, graph]: mean of all samples, 0 = unknown */
    /* per kernel/graph: ns the estimate; win_min/win_max/win_n the window of samples that may raise it */
    struct cost_entry { uintptr_t key; uint64_t ns, win_min, win_max; uint32_t win_n; } costs[COST_ENTRIES];
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
    /* the slot handover (pacing.c, slot_turn): */
    uint64_t cur_slot;         /* the slot (period number) of this process's last launch in its slot */
    uint64_t qend_ns;          /* when this process's queued work ends, the GPU its own */
    uint64_t slot_began_ns;    /* the first launch of its current slot */
    uint64_t held_ns;          /* when a launch of this process last waited for the claim's share */
    int switch_owed;           /* the slot's context switch is to be booked with the next launch */
    struct gs_marker drain;    /* marks the work launched before a wait for a later slot; by qend_ns */
    /* turns of a claim's processes in its slot (pacing.c, turn_take): */
    pthread_mutex_t turn_lock; /* this process's threads take, renew and check its turn one at a time */
    uint32_t turn_me;          /* this process's token (turn_token); 0 = not made yet */
    uint64_t turn_mine;        /* the turn word this process last wrote into the region; 0 = none */
    int turn_off;              /* someone else wrote its turn: it takes no turns (no handover) */
    /* a Burst claim's borrowed time: the lent span (pacing.c, lent_turn) and the fill (fill_turn): */
    uint64_t lent_qend_ns;     /* when its work launched in borrowed time ends, the GPU its own */
    uint64_t lent_until_ns;    /* it found the GPU busy: no launch in borrowed time before this */
    uint64_t lent_skip_ns;     /* its lent spans begin this far in: where it found the GPU busy before */
    uint64_t lent_span;        /* the lent span (period number) of its last launch there */
    int lent_hit;              /* it found the GPU busy in that span */
    int lent_off;              /* its marker could not be recorded: no borrowed time (lent span, fill) */
    struct gs_marker lent;     /* marks its work in borrowed time; by lent_qend_ns */
    uint64_t intrude_tat_ns;   /* outside its slot, launches into other claims' work: a timeline at INTRUDE_PPM (pacing.c) */
    uint32_t intrude_dry;      /* it spent its INTRUDE_BURST_NS: no such launch until that bucket is full again */
    uint64_t slot_view;        /* outside its slot: its slot's number << 2 | SLOT_FAR | SLOT_LIGHT (out_of_slot_turn) */
    uint64_t fill_tat_ns;      /* a filling Burst claim's own timeline, at FILL_HOLD_PCT of its limit (fill_turn) */
};

extern struct gpu_state g_gpu[GS_MAX_GPUS] GS_HIDDEN; /* by limit slot; valid where g_gpu_open */
extern int g_gpu_open[GS_MAX_GPUS] GS_HIDDEN;
extern pthread_mutex_t g_map_lock GS_HIDDEN;          /* device -> slot maps (devices.c) */
extern struct gs_ptrmap g_ptrs GS_HIDDEN;             /* pointer/handle -> size, GPU (memory.c) */

/* pthread_atfork handlers (registered by init.c at the first driver call) */
void gs_fork_prepare(void) GS_HIDDEN;
void gs_fork_parent(void) GS_HIDDEN;
void gs_fork_child(void) GS_HIDDEN;

#endif
