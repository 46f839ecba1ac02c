/* How long does a launch wait? Compute pacing of every kernel and graph launch
 * (cuLaunchKernel(Ex), cuLaunchCooperativeKernel, cuGraphLaunch, each with _ptsz), and the MPS
 * share of a context (cuCtxGetExecAffinity). Capture tracking: capture.c; the per-GPU state
 * (struct gpu_state's pacing fields): state.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "capture.h"
#include "devices.h"
#include "init.h"
#include "log.h"
#include "rawstat.h"
#include "symbols.h"

/* ------------------------------------------------------------------ compute pacing
 * Design, alternatives and figures: docs/compute.md. Contexts of different processes are
 * time-sliced, so an event pair around a kernel also counts the slices of the other claims'
 * contexts: a cost measured that way says little while others are busy. So:
 *  - each launch books cost/rate of the claim's timeline in a GCRA token bucket: pace_tat_ns
 *    in the region, shared by the claim's processes, and a private one per process, so that
 *    a forged region can never let a process run past the rate on its own;
 *  - the node agent gives each claim on a GPU its own time slot in a common period (control
 *    file, trusted). Inside its slot a claim may run up to a period ahead of its timeline, so
 *    a busy claim launches its period's worth there and the claims take turns: each runs
 *    alone and measures its own cost; its work drains before the slot ends, so the next slot
 *    begins on an idle GPU (the slot handover, below). Outside its slot it may run OUT_BURST_NS
 *    ahead, so a claim that uses less than its rate is never held back; where the agent's relay
 *    says when the other claims have work, it fills their idle time there instead, and launches
 *    into their work only as a request server (out_of_slot_turn, below);
 *  - cost = per kernel (function and grid) or graph: the low envelope of event-pair samples,
 *    which drops to a clean sample at once and rises only to the minimum of a window of
 *    COST_WINDOW samples that all lie above it (preempted samples are common; a trend is not);
 *  - nothing is recorded, queried, synchronised or slept on a capturing stream, and no event
 *    is queried or synchronised while a capture is active in the process (global-mode
 *    capture forbids it on every stream).
 * Without a slot (no agent, older plugin) the bucket may run BURST_NS ahead anywhere. */

#define BURST_NS 10000000ull      /* no slot: 10 ms */
#define OUT_BURST_NS 2000000ull   /* outside the claim's slot: 2 ms */
#define SAMPLE_NS 10000000ull     /* one measured launch per 10 ms */
#define COST_WINDOW 16            /* samples a cost may rise on: their minimum */
#define COST_SPREAD_PCT 10        /* ... when the longest of them is at most this much above it */
#define TAT_SANE_NS 10000000000ull /* a timeline further ahead is forged: ignored */
#define SWITCH_NS 300000ull       /* a context switch (the H100: about 0.3 ms): each slot of a shared GPU pays one */
#define MARK_NS 2000000ull        /* a progress marker when this much work is queued */
#define QUEUE_NS 10000000ull      /* in its slot a process queues at most this much work ahead */
#define LATE_NS (2 * QUEUE_NS)      /* late work is looked for this long after a slot's first launch */
#define DRAIN_POLL_NS 100000ull   /* how often a slot's first launch looks whether the earlier work ran */
#define LENT_AHEAD_NS 500000ull   /* in a lent span a process queues this much beyond its running work */
#define LENT_LATE_NS 1000000ull   /* a lent marker this late: another context has work on the GPU */
#define LENT_SKIP_NS 5000000ull   /* then its next lent spans begin this much after where it saw that */
#define LENT_DECAY_NS 4000000ull  /* and a span with no other work seen begins this much earlier */
enum { KIND_KERNEL = 0, KIND_GRAPH = 1 };

struct launch {
    struct gpu_state *g;  /* NULL: not paced */
    int kind, ptsz, sampling, lent;
    uintptr_t key;
    CUstream stream;
};

static uint64_t rate_ppm(struct gpu_state *g)
{
    /* Trusted (root-owned, read-only in the container), so it may exceed the limit: the agent
     * raises a Burst claim's rate into idle time. */
    uint64_t trusted = g->control ? gs_control_rate(g->control) : 0;
    if (trusted) return trusted > 1000000 ? 1000000 : trusted;
    uint64_t limit = (uint64_t)g->compute * 10000;
    uint64_t agent = __atomic_load_n(&g->region.hdr->pace_rate_ppm, __ATOMIC_RELAXED);
    if (agent == 0 || (!g->burst && agent > limit)) return limit;
    return agent > 1000000 ? 1000000 : agent;
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

static CUresult record(CUevent e, CUstream s, int ptsz)
{
    return ptsz ? real_cuEventRecord_ptsz(e, s) : real_cuEventRecord(e, s);
}


static struct cost_entry *cost_entry(struct gpu_state *g, uintptr_t key)
{
    return &g->costs[((key >> 4) ^ (key >> 14)) % COST_ENTRIES];
}

/* the launch's cost: its own entry, else the mean of the kind; 0 = never measured. (Key and
 * ns are two loads: a racing update may charge one launch another's cost.) */
static uint64_t cost_of(struct gpu_state *g, int kind, uintptr_t key)
{
    struct cost_entry *e = cost_entry(g, key);
    uint64_t ns = __atomic_load_n(&e->key, __ATOMIC_RELAXED) == key ? __atomic_load_n(&e->ns, __ATOMIC_RELAXED) : 0;
    return ns ? ns : __atomic_load_n(&g->cost_ns[kind], __ATOMIC_RELAXED);
}

/* under sample_lock: read a finished sample into the cost estimates */
static void finish_sample(struct gpu_state *g)
{
    CUresult q = real_cuEventQuery(g->ev1);
    if (q == CUDA_ERROR_NOT_READY) return;
    float ms = 0;
    g->pending = 0;
    if (q != CUDA_SUCCESS || real_cuEventElapsedTime_v2(&ms, g->ev0, g->ev1) != CUDA_SUCCESS) return;
    /* +1: a measured cost is never 0, so 0 keeps meaning "not measured yet" */
    uint64_t sample = (ms > 0 ? (uint64_t)((double)ms * 1e6) : 0) + 1;
    uint64_t *c = &g->cost_ns[g->pending_kind];
    uint64_t old = __atomic_load_n(c, __ATOMIC_RELAXED);
    __atomic_store_n(c, old ? (3 * old + sample) / 4 : sample, __ATOMIC_RELAXED);
    struct cost_entry *e = cost_entry(g, g->pending_key);
    old = e->key == g->pending_key ? e->ns : 0;
    if (!old || e->key != g->pending_key) e->win_min = UINT64_MAX, e->win_max = 0, e->win_n = 0;
    uint64_t ns = !old || sample < old ? sample : old;
    if (g->mps && old && sample >= old && !g->pending_upper) { /* MPS: no slices to inflate a sample; a
        kernel's time moves with the clients beside it, and the rise of 1/32 (at most 1/32 of itself)
        follows it (the window below charged 4 clients of a 25 % claim 27-30 % of the work) */
        uint64_t rise = (sample - old) / 32 < old / 32 ? (sample - old) / 32 : old / 32;
        ns = old + rise;
    } else if (!g->pending_upper && old) { /* a window of COST_WINDOW samples all above, and close
        together: the kernel got dearer. Samples that spread (the longest more than COST_SPREAD_PCT
        above the shortest) count other contexts' slices, whose number varies from kernel to kernel:
        a neighbour that launches into every slice (an eager framework's small kernels) made each of
        a 2.65 ms kernel's samples read 3.3-4.5 ms, and the claim was charged 3.3 */
        if (sample < e->win_min) e->win_min = sample;
        if (sample > e->win_max) e->win_max = sample;
        if (++e->win_n >= COST_WINDOW) {
            if (e->win_min > ns && e->win_max * 100 <= e->win_min * (100 + COST_SPREAD_PCT)) ns = e->win_min;
            e->win_min = UINT64_MAX, e->win_max = 0, e->win_n = 0;
        }
    }
    __atomic_store_n(&e->ns, ns, __ATOMIC_RELAXED);
    __atomic_store_n(&e->key, g->pending_key, __ATOMIC_RELAXED);
}

/* GCRA: book interval on timeline *tat, not starting before floor (<= now); returns the time
 * the booking starts at */
static uint64_t book(uint64_t *tat, uint64_t now, uint64_t floor, uint64_t interval)
{
    uint64_t old = __atomic_load_n(tat, __ATOMIC_RELAXED), base;
    do { /* ignore an absurd timeline (the region is tenant-writable) */
        base = old > floor && old < now + TAT_SANE_NS ? old : floor;
    } while (!__atomic_compare_exchange_n(tat, &old, base + interval, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return base;
}

/* The claim's shared timeline (the region's pace_tat_ns) only ever moves forward: every booking
 * writes max(old, floor) + interval. So a value below the one this process last wrote there, or
 * an absurd one, means someone wrote the region: a tenant that keeps it at 0 lets each of its
 * processes run at the claim's whole rate on its private bucket, N processes N times the share
 * (issue 26). From then on this process paces its private bucket at rate / procs, procs being
 * the agent's count of the claim's processes on the GPU (trusted control file): together they
 * hold the claim's rate whatever the region says. Sticky for the process's life. */
static uint64_t book_shared(struct gpu_state *g, uint64_t now, uint64_t floor, uint64_t interval)
{
    uint64_t *tat = &g->region.hdr->pace_tat_ns;
    /* last before old (acquire/release): another thread's write is in the timeline before its
     * my_shared_ns, so an honest timeline is never seen below it */
    uint64_t last = __atomic_load_n(&g->my_shared_ns, __ATOMIC_ACQUIRE);
    uint64_t old = __atomic_load_n(tat, __ATOMIC_RELAXED), base;
    do {
        if ((old < last || old >= now + TAT_SANE_NS) && !__atomic_exchange_n(&g->forged, 1, __ATOMIC_RELAXED))
            gs_log("GPU %d: the claim's pacing timeline in the usage region went back (%llu ns, this process wrote "
                   "%llu): a process of the claim writes the region; this process now paces itself at the claim's "
                   "rate / %u (the processes the node agent sees)", g->index, (unsigned long long)old,
                   (unsigned long long)last, g->control ? gs_control_procs(g->control) : 1u);
        base = old > floor && old < now + TAT_SANE_NS ? old : floor;
    } while (!__atomic_compare_exchange_n(tat, &old, base + interval, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    __atomic_store_n(&g->my_shared_ns, base + interval, __ATOMIC_RELEASE);
    return base;
}

/* What the node agent reads of a launch: the claim's charged GPU time (a busy claim), and its
 * longest launch since the agent last zeroed it (a slot holds whole kernels: the agent lengthens the
 * GPU's slot period until a slot loses little after its last one). Tenant-writable: a forged length
 * only stretches the period, which spaces the GPU's slots further apart, never moves a rate. */
static void charge(struct gpu_state *g, uint64_t cost)
{
    struct gs_region_header *h = g->region.hdr;
    __atomic_add_fetch(&h->pace_gpu_ns, cost, __ATOMIC_RELAXED);
    uint32_t us = cost / 1000 > UINT32_MAX ? UINT32_MAX : (uint32_t)(cost / 1000);
    uint32_t old = __atomic_load_n(&h->pace_kernel_us, __ATOMIC_RELAXED);
    while (us > old && !__atomic_compare_exchange_n(&h->pace_kernel_us, &old, us, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

/* MPS (docs/strategies.md): kernels of the MPS server's clients run side by side, each on the
 * SMs the server gives its context, so a launch costs its GPU time times that part of the SMs:
 * an MPS claim's timeline counts SM-time. A lone client the server holds to the share then books
 * exactly its rate and never waits; several processes of one claim, or a client at a larger
 * claim's ceiling (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE unset or raised), are held to the share
 * together. What a context may use is asked of the driver, never read from the environment the
 * tenant writes: only an MPS context has an SM limit (cuCtxGetExecAffinity; a plain context
 * answers all the GPU's SMs, the H200's driver did). A plain context (the pipe folder dropped or
 * pointed elsewhere), an unknown SM count (limits file) or a driver before CUDA 11.4 costs the
 * whole GPU, as under TimeSlicing, said once. One answer per context, kept until another context
 * launches or it is destroyed. */
#define MPS_SM_SLACK 2u /* SMs of a TPC: the driver rounds an SM limit up to whole TPCs (cuda.h) */

static uint64_t mps_scale(struct gpu_state *g)
{
    CUcontext ctx = NULL;
    if (real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return 1000000;
    if (__atomic_load_n(&g->mps_ctx, __ATOMIC_ACQUIRE) == ctx) return __atomic_load_n(&g->mps_ppm, __ATOMIC_RELAXED);
    CUexecAffinityParam a = {0};
    CUresult rc = g->sm_count ? real_cuCtxGetExecAffinity(&a, CU_EXEC_AFFINITY_TYPE_SM_COUNT) : CUDA_ERROR_NOT_SUPPORTED;
    uint64_t sms = a.param.smCount.val, ppm = 1000000; /* no answer: the whole GPU */
    if (rc == CUDA_SUCCESS && sms * 100 <= (uint64_t)g->sm_count * (uint64_t)g->compute + MPS_SM_SLACK * 100)
        ppm = (uint64_t)g->compute * 10000; /* the driver's rounding up to a whole TPC is not the tenant's */
    else if (rc == CUDA_SUCCESS && sms < g->sm_count)
        ppm = sms * 1000000 / g->sm_count;
    __atomic_store_n(&g->mps_ppm, ppm, __ATOMIC_RELAXED); /* a racing reader may take one launch at another's */
    __atomic_store_n(&g->mps_ctx, ctx, __ATOMIC_RELEASE);
    static int said;
    /* all the GPU's SMs under a share below 100: a context the server does not hold */
    int unheld = rc != CUDA_SUCCESS || (sms >= g->sm_count && g->compute < 100);
    if (unheld && !__atomic_exchange_n(&said, 1, __ATOMIC_ACQ_REL)) {
        if (!g->sm_count)
            gs_log("MPS claim: the limits file does not give the GPU's SM count; a launch costs its time on the whole "
                   "GPU (paced as under TimeSlicing)");
        else if (rc != CUDA_SUCCESS)
            gs_log("MPS claim: this process is no MPS client of the claim's server (cuCtxGetExecAffinity: %d); "
                   "paced to the %d %% share as under TimeSlicing", rc, g->compute);
        else
            gs_log("MPS claim: this process's context has all %llu SMs (no MPS client of the claim's server, or one "
                   "it does not hold to the share); paced to the %d %% share as under TimeSlicing",
                   (unsigned long long)sms, g->compute);
    }
    return ppm;
}

/* ------------------------------------------------------------------ the slot handover
 * On a GPU the claims share, each slot should begin on an idle GPU: work of two claims queued at
 * the same time makes the GPU alternate between them at every time-slice end, each alternation
 * a context switch, and each claim's cost samples count the other's slices. So (docs/compute.md,
 * "The chosen design"):
 *  - before it waits for a later slot, a process marks the end of the work it has launched
 *    (the drain marker); the first launch of its next slot waits until that work has run (polled), so
 *    a claim never adds to work that still spills over from an earlier slot;
 *  - in its slot it keeps the predicted end of its queued work (qend_ns: the GPU its own from
 *    the slot's first launch on, after a switch), and a marker every MARK_NS of queued work:
 *    a marker that has not run when it should have means the work is late (the slot began
 *    behind the previous claim's work, or the GPU was not ours), and the prediction moves by as
 *    much. It queues at most QUEUE_NS ahead, so a marker is never far from the GPU's work;
 *  - a launch of a busy claim (this process held back for the share within the last period)
 *    that would end past the slot's end waits for the next slot, so the slot's work has drained
 *    when the next claim's slot begins; a claim under its share is never held by this. A slot's
 *    first launch always goes (a kernel longer than the slot is paced over several periods by
 *    the bucket); what is left of a slot after its last whole kernel is lost to the claim;
 *  - on a shared GPU each slot's context switch is booked with its first launch, so the claims'
 *    booked GPU time per period leaves room for the switches. */
static uint64_t slot_phase(uint64_t t, uint64_t start, uint64_t period) { return (t % period + period - start) % period; }

/* a launch waits from..to to hold the claim's share */
static void note_paced(struct gpu_state *g, uint64_t from, uint64_t to)
{
    if (to <= from) return;
    __atomic_add_fetch(&g->region.hdr->paced_ns, to - from, __ATOMIC_RELAXED);
    __atomic_store_n(&g->held_ns, to, __ATOMIC_RELAXED);
}

/* hold the launch from now until t for the share; t is the new now */
static uint64_t hold_until(struct gpu_state *g, uint64_t now, uint64_t t)
{
    note_paced(g, now, t);
    sleep_until(t);
    return t;
}

/* record m after the work queued on s, due at pred; 0 when no event could be recorded */
static int marker_record(struct gs_marker *m, CUstream s, int ptsz, uint64_t pred)
{
    if (!m->ev && real_cuEventCreate(&m->ev, CU_EVENT_DEFAULT) != CUDA_SUCCESS) m->ev = NULL;
    if (!m->ev) return 0;
    if (record(m->ev, s, ptsz) == CUDA_SUCCESS) {
        __atomic_store_n(&m->pred_ns, pred, __ATOMIC_RELAXED);
        __atomic_store_n(&m->pending, 1, __ATOMIC_RELEASE);
        return 1;
    }
    real_cuEventDestroy_v2(m->ev); /* an event of another context: a new one next time */
    m->ev = NULL;
    __atomic_store_n(&m->pending, 0, __ATOMIC_RELAXED);
    return 0;
}

/* mark the end of the work launched so far on s (nothing while a capture is active) */
static void mark_drain(struct gpu_state *g, CUstream s, int ptsz, int captures)
{
    if (captures || capturing(s, ptsz)) return;
    marker_record(&g->drain, s, ptsz, __atomic_load_n(&g->qend_ns, __ATOMIC_RELAXED));
}

/* The queue as it is, not as predicted: in its slot a process launches only while its pending
 * drain marker is at most QUEUE_NS of work behind its queue's predicted end, and waits (polled,
 * until the slot's end at most) for it to run otherwise. The prediction takes the GPU as the
 * claim's own from the slot's first launch on; where it was not (the slot began behind another
 * claim's work that spilled over by more than the late-work check sees, 20 ms), the queue grew
 * past any bound, spilled into the next claim's slot, and that claim's slot began behind it in
 * turn: at a 1 s period two claims at 30/70 settled with 100-190 ms queued each, the 70 at 62-65 %
 * (static slots, 8 s runs, one in two). With the real queue bounded, what spills is at most a
 * queue, which the late-work check sees. */
/* the pending drain marker has not run at now: if that is past its predicted time, the work queued
 * after it is late by as much, and so is the queue's predicted end */
static void drain_late(struct gpu_state *g, uint64_t now)
{
    uint64_t pred = __atomic_load_n(&g->drain.pred_ns, __ATOMIC_RELAXED);
    if (now <= pred) return;
    __atomic_add_fetch(&g->qend_ns, now - pred, __ATOMIC_RELAXED);
    __atomic_store_n(&g->drain.pred_ns, now, __ATOMIC_RELAXED);
}

/* wait, polled every DRAIN_POLL_NS and at most until end, for the pending drain marker to run (no
 * event is asked about while a capture is active); returns the time, with the marker no longer
 * pending if it ran, and the queue's predicted end moved by how late it ran */
static uint64_t drain_wait(struct gpu_state *g, uint64_t now, uint64_t end)
{
    while (__atomic_load_n(&g->drain.pending, __ATOMIC_ACQUIRE) && !__atomic_load_n(&g_captures, __ATOMIC_RELAXED)) {
        if (real_cuEventQuery(g->drain.ev) != CUDA_ERROR_NOT_READY) {
            __atomic_store_n(&g->drain.pending, 0, __ATOMIC_RELAXED);
            break;
        }
        drain_late(g, now);
        if (now >= end) break;
        uint64_t t = now + DRAIN_POLL_NS < end ? now + DRAIN_POLL_NS : end;
        note_paced(g, now, t);
        sleep_until(t);
        now = gs_now_ns();
    }
    return now;
}

static uint64_t queue_bound(struct gpu_state *g, uint64_t now, int captures, uint64_t end)
{
    if (captures || !__atomic_load_n(&g->drain.pending, __ATOMIC_ACQUIRE) ||
        __atomic_load_n(&g->qend_ns, __ATOMIC_RELAXED) <= __atomic_load_n(&g->drain.pred_ns, __ATOMIC_RELAXED) + QUEUE_NS)
        return now;
    return drain_wait(g, now, end); /* when it ran, the next launch marks the queue again */
}

/* ---- turns: a claim of several time-sliced processes (the agent's procs)
 * The handover holds one context per claim. The processes of a claim with several used to pace
 * each alone on the claim's timeline, their kernels interleaving in its slot, each cost sample
 * counting the others' slices: 4 processes of a 25 % claim were charged 4.1 ms for each 2.65 ms
 * kernel, left 29 % of the slot idle and got 18-20 %. So they take turns in the slot, each holding
 * the handover alone while its turn lasts. The region's pace_turn is one word: the holder's token
 * (turn_token; 0 = given back) and when the turn lapses (the holder's predicted queue end and
 * TURN_IDLE_NS, renewed at its launches; once given back at the slot's end, when its work ends).
 * One compare-and-swap takes, renews or gives it back, so nobody takes a turn its holder renewed.
 * A process waits (polled) for the turn; then the GPU is taken as busy until the previous holder's
 * work ends.
 * Forged turns: an honest process takes a turn only when it was given back or has lapsed, and
 * writes no token but its own. So a process that finds its turn gone before the lapse it wrote,
 * its token with a lapse it did not write, or a lapse more than TAT_SANE_NS ahead, knows that
 * someone else writes the word: from then on (one log line) it takes no turns and paces as such a
 * claim's processes did before (no handover; the timeline and its own bucket hold the share). A
 * forged turn once let a claim's processes overlap in its slot and spill into the neighbour's
 * (its 75 % neighbour read 70.2-70.3). */
#define TURN_IDLE_NS 2000000ull /* a holder that stops launching lets the turn lapse this long after its work */
#define TURN_SHIFT 40            /* the word: token << TURN_SHIFT | the lapse in 1.024 us units */
#define TURN_MASK ((1ull << TURN_SHIFT) - 1)

static uint64_t turn_word(uint32_t token, uint64_t until_ns)
{
    return (uint64_t)token << TURN_SHIFT | ((until_ns >> 10) & TURN_MASK);
}
static uint32_t turn_holder(uint64_t w) { return (uint32_t)(w >> TURN_SHIFT); }
static uint64_t turn_until(uint64_t w) { return (w & TURN_MASK) << 10; }

/* this process among the claim's: of its pid and pid namespace (the claim's containers may each
 * have a pid 1), 24 bits, never 0. Made once per process (not a getpid and a stat per launch:
 * threads may race to make it, with the same value); a fork child's is made anew (gs_fork_child) */
static uint32_t turn_token(struct gpu_state *g)
{
    uint32_t token = __atomic_load_n(&g->turn_me, __ATOMIC_RELAXED);
    if (token) return token;
    struct stat st;
    uint64_t pidns = gs_stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
    uint64_t x = ((uint64_t)getpid() << 32 ^ pidns) * 0x9E3779B97F4A7C15ull;
    token = (uint32_t)(x >> TURN_SHIFT) | 1;
    __atomic_store_n(&g->turn_me, token, __ATOMIC_RELAXED);
    return token;
}

/* under turn_lock: w, just read, is not what an honest claim could have written: say so once. The
 * clock is read after w: a process that took our lapsed turn read its clock before */
static int turn_forged(struct gpu_state *g, uint32_t me, uint64_t w)
{
    uint64_t mine = g->turn_mine, now = gs_now_ns();
    int forged = turn_until(w) > now + TAT_SANE_NS                                        /* no turn lasts so long */
                 || (turn_holder(w) == me && w != mine)                                   /* our token, not our word */
                 || (turn_holder(mine) == me && w != mine && turn_until(mine) > now);     /* ours, gone before its lapse */
    if (forged && !__atomic_exchange_n(&g->turn_off, 1, __ATOMIC_RELAXED)) {
        gs_log("GPU %d: the turn of the claim's processes in the usage region was written by another process "
               "(%#llx, this process wrote %#llx): this process takes no turns from now on", g->index,
               (unsigned long long)w, (unsigned long long)mine);
    }
    return forged;
}

/* this process's turn in the slot that ends at end, waited for (at most until end). Returns the
 * time; *got: 1 when it holds the turn; *free: when the previous holder's work ends, *was: the
 * lapse its word said (both 0: it held the turn already) */
static uint64_t turn_take(struct gpu_state *g, uint32_t me, uint64_t now, uint64_t end, uint64_t period,
                          int *got, uint64_t *free, uint64_t *was)
{
    uint64_t *word = &g->region.hdr->pace_turn;
    *got = 0;
    *free = *was = 0;
    for (;;) {
        pthread_mutex_lock(&g->turn_lock);
        uint64_t w = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&g->turn_off, __ATOMIC_RELAXED) || turn_forged(g, me, w)) {
            pthread_mutex_unlock(&g->turn_lock);
            return now;
        }
        int ours = turn_holder(w) == me;
        if (ours && turn_until(w) >= now) {
            *got = 1;
        } else if (ours || turn_holder(w) == 0 || turn_until(w) < now) {
            /* ours lapsed while it waited (renewed unless taken meanwhile), or given back, or lapsed:
             * until the slot's end, renewed lower at its launches */
            uint64_t mine = turn_word(me, end);
            if (__atomic_compare_exchange_n(word, &w, mine, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                g->turn_mine = mine;
                *got = 1;
                if (!ours) { /* another's: the GPU is busy until its work ends */
                    *free = turn_until(w) > now && turn_until(w) < now + period ? turn_until(w) : now;
                    *was = turn_until(w);
                }
            }
        }
        pthread_mutex_unlock(&g->turn_lock);
        if (*got || now >= end) return now;
        uint64_t t = now + DRAIN_POLL_NS < end ? now + DRAIN_POLL_NS : end;
        note_paced(g, now, t);
        sleep_until(t);
        now = gs_now_ns();
    }
}

/* the holder's launches renew its turn to until; give = 1: it gives it back, its work ending then */
static void turn_renew(struct gpu_state *g, uint32_t me, uint64_t until, int give)
{
    uint64_t *word = &g->region.hdr->pace_turn;
    pthread_mutex_lock(&g->turn_lock);
    uint64_t w = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if (!__atomic_load_n(&g->turn_off, __ATOMIC_RELAXED) && !turn_forged(g, me, w) && turn_holder(w) == me) {
        uint64_t next = turn_word(give ? 0 : me, until);
        if (__atomic_compare_exchange_n(word, &w, next, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            g->turn_mine = next;
    }
    pthread_mutex_unlock(&g->turn_lock);
}

/* where the claim's timeline stands: the region's, unless forged (absurd, or behind this
 * process's own) */
static uint64_t timeline_at(struct gpu_state *g, uint64_t now)
{
    uint64_t old = __atomic_load_n(&g->region.hdr->pace_tat_ns, __ATOMIC_RELAXED);
    uint64_t mine = __atomic_load_n(&g->my_tat_ns, __ATOMIC_RELAXED);
    return old < now + TAT_SANE_NS && old > mine ? old : mine;
}

/* Catching up (issue 39): a claim whose slot held less than its share (a neighbour's launches ran
 * in it, or its own host time left it idle: an eager framework's step) is behind its timeline
 * when its slot ends; where the agent's relay runs for it, it goes on outside its slot as
 * out_of_slot_turn (below) allows, into the others' idle time. One that booked its share, or is
 * behind by less than a kernel and the 2 ms a launch outside its slot may run ahead, waits for its
 * next slot: without that rule or without the relay, launching into the neighbours' work cost them
 * (3 tenants at 10/30/60: the 60 read 51; the 70 of a 4 us pair 54) */
static int behind_at_slot_end(struct gpu_state *g, uint64_t now, uint64_t next_slot, uint64_t cost)
{
    uint64_t until, tat = timeline_at(g, next_slot), owed = next_slot > tat ? next_slot - tat : 0;
    if (!gs_control_owner_busy(g->control, now, &until)) return 0;
    return owed > cost * 1000000 / rate_ppm(g) + OUT_BURST_NS;
}

/* in the claim's slot, before booking: see the comment above. Returns the time it goes on at,
 * in a slot of the claim. me: this process's turn token, 0 = a claim of one process (no turns) */
static uint64_t slot_turn(struct gpu_state *g, CUstream s, int ptsz, int captures, uint64_t now, uint64_t start,
                          uint64_t len, uint64_t lent, uint64_t period, uint64_t cost, uint32_t me)
{
    int shared = len < period;
    for (;;) {
        uint64_t phase = slot_phase(now, start, period), opens = now - phase, end = opens + len;
        if (phase >= len) { /* the slot ended while the earlier work ran: the next one, or the lent span
                             * before it; a claim behind its timeline catches up outside its slot */
            if (!lent && behind_at_slot_end(g, now, opens + period, cost)) return now;
            uint64_t next = opens + period - lent; /* the lent span may have begun */
            now = next > now ? hold_until(g, now, next) : now;
            if (lent) return now;
            continue;
        }
        uint64_t free = 0, was = 0;
        if (me) {
            int got;
            now = turn_take(g, me, now, end, period, &got, &free, &was);
            if (__atomic_load_n(&g->turn_off, __ATOMIC_RELAXED)) return now; /* forged: no handover */
            if (!got) continue; /* the slot ended waiting for the turn */
        }
        uint64_t no = (now + period - start) / period;
        if (__atomic_exchange_n(&g->cur_slot, no, __ATOMIC_RELAXED) != no || free) { /* the slot's (or turn's) first launch */
            now = drain_wait(g, now, end);
            if (now >= end) continue;
            uint64_t q = (free > now ? free : now) + (shared ? SWITCH_NS : 0);
            /* the first launch of the claim's slot always goes (a kernel longer than the slot is
             * paced over periods by the timeline); a turn taken from a sibling that worked in this
             * slot is not the claim's first: its launch goes only where it fits, as the sibling's
             * would (each sibling's first kernel at a slot's end spilled into the next claim's slot:
             * 4 processes of a 25 % claim spilled 10-19 ms a period into their 75 % neighbour's) */
            if (was > opens && q + cost > end) {
                turn_renew(g, me, was, 1); /* given back, the sibling's work ending as it said */
                now = hold_until(g, now, opens + period - lent);
                if (lent) return now;
                continue;
            }
            __atomic_store_n(&g->drain.pending, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&g->qend_ns, q, __ATOMIC_RELAXED);
            __atomic_store_n(&g->slot_began_ns, now, __ATOMIC_RELAXED);
            __atomic_store_n(&g->switch_owed, shared, __ATOMIC_RELAXED);
            return now;
        }
        /* the marker should have run by now: the work is late by at least as much (the slot began
         * behind the previous claim's work), so is its end. Only early in the slot: what spills
         * over from the previous slot is at most a queue's worth, while work that is late all
         * through the slot shares the GPU with contexts nobody paces (an MPS server, a claim of
         * another strategy), and holding it back would only cost the claim its share */
        if (__atomic_load_n(&g->drain.pending, __ATOMIC_ACQUIRE) && !captures &&
            now < __atomic_load_n(&g->slot_began_ns, __ATOMIC_RELAXED) + LATE_NS &&
            now > __atomic_load_n(&g->drain.pred_ns, __ATOMIC_RELAXED)) {
            if (real_cuEventQuery(g->drain.ev) == CUDA_ERROR_NOT_READY)
                drain_late(g, now);
            else
                __atomic_store_n(&g->drain.pending, 0, __ATOMIC_RELAXED);
        }
        uint64_t q = __atomic_load_n(&g->qend_ns, __ATOMIC_RELAXED);
        if (q < now) q = now;
        if (q + cost <= end) return now;
        /* a claim under its share (this process not held back within the last period) is not
         * held: it launches at once, anywhere */
        if (__atomic_load_n(&g->held_ns, __ATOMIC_RELAXED) + period < now) return now;
        /* it would end past the slot: the next slot, or the lent span before it, after the work
         * queued now has run; a claim behind its timeline catches up outside its slot from the
         * slot's end */
        if (me) turn_renew(g, me, q, 1); /* given back, its work ending at q */
        mark_drain(g, s, ptsz, captures);
        if (!lent && behind_at_slot_end(g, now, opens + period, cost)) return hold_until(g, now, end);
        now = hold_until(g, now, opens + period - lent);
        if (lent) return now;
    }
}

/* ------------------------------------------------------------------ borrowed time
 * A Burst claim launching in time another claim may need (the lent span, the fill: below) keeps at
 * most LENT_AHEAD_NS queued beyond its running work, a marker event after it, so that it gives the
 * GPU up within a kernel. borrow_wait: at now, with its queue predicted to end at q (>= now), 0 when
 * the launch may go; else when to look again, or BORROW_LATE when its marker is LENT_LATE_NS later
 * than it should have run: another context has work (time slicing made our kernel wait) */
#define BORROW_LATE UINT64_MAX

static uint64_t borrow_wait(struct gpu_state *g, uint64_t now, uint64_t q)
{
    if (__atomic_load_n(&g->lent.pending, __ATOMIC_ACQUIRE)) {
        uint64_t pred = __atomic_load_n(&g->lent.pred_ns, __ATOMIC_RELAXED);
        if (real_cuEventQuery(g->lent.ev) == CUDA_ERROR_NOT_READY) {
            if (now > pred + LENT_LATE_NS) return BORROW_LATE;
            if (q > now + LENT_AHEAD_NS) /* look again when the marker is late, at the latest */
                return pred + LENT_LATE_NS + 1 < q - LENT_AHEAD_NS ? pred + LENT_LATE_NS + 1 : q - LENT_AHEAD_NS;
            return 0;
        }
        __atomic_store_n(&g->lent.pending, 0, __ATOMIC_RELAXED); /* it ran */
    }
    return q > now + LENT_AHEAD_NS ? q - LENT_AHEAD_NS : 0;
}

/* borrowing where its marker said another context has work the relay has not told of yet: no
 * borrowed launch for LENT_SKIP_NS, and its marker is not taken as late again before then */
static void give_way(struct gpu_state *g, uint64_t now)
{
    __atomic_store_n(&g->lent_until_ns, now + LENT_SKIP_NS, __ATOMIC_RELAXED);
    __atomic_store_n(&g->lent.pred_ns, now + LENT_SKIP_NS, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------ the lent span
 * A busy Burst claim whose slot follows a busy Hard claim's that the Hard claim leaves partly idle
 * (it charged less GPU time than its slot holds) is lent the idle tail of that slot: lent_us right
 * before its own slot (control file; the agent leaves a margin after the owner's GPU time). There
 * it launches while the GPU runs no other work, never on its timeline: it keeps at most
 * LENT_AHEAD_NS queued beyond its running work, a marker event after it. A marker LENT_LATE_NS
 * later than it should have run means another context has work (the owner's: time slicing made
 * our kernel wait): the process gives up the rest of the span, and its next spans begin
 * LENT_SKIP_NS after where it saw that, LENT_DECAY_NS earlier for each span it sees no other work
 * in. So the owner loses about a slice at most once a period, and where its work ends at the same
 * place every period, not even that. Its work in the span runs on into its own slot, the same
 * context: no switch. Returns 1 with *now set when the launch goes now in the lent span, 0 when it
 * is not in it (then the usual rules apply). */
static int lent_turn(struct gpu_state *g, uint64_t *nowp, uint64_t start, uint64_t lent, uint64_t period, uint64_t cost)
{
    uint64_t now = *nowp, lstart = (start + period - lent) % period;
    for (;;) {
        uint64_t phase = slot_phase(now, lstart, period);
        if (phase >= lent) break;
        uint64_t end = now - phase + lent, wait = 0; /* its own slot begins */
        uint64_t no = (now + period - lstart) / period;
        if (__atomic_exchange_n(&g->lent_span, no, __ATOMIC_RELAXED) != no && !__atomic_exchange_n(&g->lent_hit, 0, __ATOMIC_RELAXED)) {
            uint64_t skip = __atomic_load_n(&g->lent_skip_ns, __ATOMIC_RELAXED);
            __atomic_store_n(&g->lent_skip_ns, skip > LENT_DECAY_NS ? skip - LENT_DECAY_NS : 0, __ATOMIC_RELAXED);
        }
        uint64_t until = __atomic_load_n(&g->lent_until_ns, __ATOMIC_RELAXED), skip = __atomic_load_n(&g->lent_skip_ns, __ATOMIC_RELAXED);
        if (until < now - phase + skip) until = now - phase + skip;
        uint64_t q = __atomic_load_n(&g->lent_qend_ns, __ATOMIC_RELAXED);
        if (q < now) q = now;
        wait = now < until ? until : borrow_wait(g, now, q);
        if (wait == BORROW_LATE) { /* the GPU is not ours: the owner's turn, for the rest of the span */
            uint64_t s = phase + LENT_SKIP_NS < lent ? phase + LENT_SKIP_NS : lent;
            if (s > skip) __atomic_store_n(&g->lent_skip_ns, s, __ATOMIC_RELAXED);
            __atomic_store_n(&g->lent_hit, 1, __ATOMIC_RELAXED);
            __atomic_store_n(&g->lent_until_ns, end, __ATOMIC_RELAXED);
            continue;
        }
        if (!wait) {
            __atomic_store_n(&g->lent_qend_ns, q + cost, __ATOMIC_RELAXED);
            *nowp = now;
            return 1;
        }
        if (wait > end) wait = end;
        if (wait < now + DRAIN_POLL_NS && wait < end) wait = now + DRAIN_POLL_NS;
        sleep_until(wait);
        now = gs_now_ns();
    }
    *nowp = now;
    return 0;
}

/* after a launch in the lent span: a marker after it, unless one is in flight */
static void lent_mark(struct gpu_state *g, CUstream s, int ptsz)
{
    if (__atomic_load_n(&g->lent.pending, __ATOMIC_ACQUIRE) || capturing(s, ptsz)) return;
    if (!marker_record(&g->lent, s, ptsz, __atomic_load_n(&g->lent_qend_ns, __ATOMIC_RELAXED)))
        __atomic_store_n(&g->lent_off, 1, __ATOMIC_RELAXED); /* no marker: no lent span */
}

/* ------------------------------------------------------------------ the fill
 * A busy Hard claim that works in bursts leaves its slot idle between them, and a Burst claim
 * cannot see that on a time-sliced GPU but by trying (each try costs the owner about a slice).
 * So where one Burst claim, of one process, shares the GPU with Hard claims only (all paced), the
 * agent lays out the Hard claims' slots alone over the whole period and tells the Burst claim to
 * fill (lent_us = period_us): it launches, on no slot, whenever the agent's relay says no Hard
 * claim has work (owner_busy_until_ns, from their launches and predicted queue ends, looked at
 * every 2 ms), keeping at most LENT_AHEAD_NS queued beyond its running work so that it gives the
 * GPU up within a kernel. The busy Hard claims' slots cover the period between them, so one alone
 * launches its period's worth wherever in the period its work comes. What a Hard tenant writes in
 * its region (its launches, its queue end) can make the Burst claim wait, never past its own
 * share: the Burst claim keeps its own timeline at FILL_HOLD_PCT of its limit, and one more than
 * FILL_OWED_NS behind it launches whatever the relay says. Without a relay (none seen for
 * GS_RELAY_STALE_NS) the claim is paced at its limit with no slot. Returns 1 with *nowp set when
 * the launch goes; 0 when the relay is gone (the caller paces it so). */
#define FILL_OWED_NS 50000000ull /* a filler this far behind its limit's timeline no longer waits */
#define FILL_HOLD_PCT 95          /* the part of its limit the timeline holds it to: the switches and the
                                   * relay's margins cost the GPU a few points, and at 100 the filler took
                                   * them from a steady Hard neighbour by launching into its work (the two
                                   * then interleaved: a Hard 70 read 64-65, the Burst 30 28) */

static int fill_turn(struct gpu_state *g, uint64_t *nowp, uint64_t period, uint64_t cost)
{
    uint64_t now = *nowp;
    for (;;) {
        uint64_t owner = 0, wait = 0;
        if (!gs_control_owner_busy(g->control, now, &owner)) {
            *nowp = now;
            return 0;
        }
        uint64_t tat = __atomic_load_n(&g->fill_tat_ns, __ATOMIC_RELAXED);
        if (!tat) __atomic_store_n(&g->fill_tat_ns, tat = now, __ATOMIC_RELAXED); /* owes and is owed nothing yet */
        int owed = tat + FILL_OWED_NS < now;
        uint64_t until = owed ? 0 : __atomic_load_n(&g->lent_until_ns, __ATOMIC_RELAXED);
        if (!owed && owner > until) until = owner;
        uint64_t q = __atomic_load_n(&g->lent_qend_ns, __ATOMIC_RELAXED);
        if (q < now) q = now;
        if (now < until) /* the Hard claims' work: until it ends, or until this claim is owed its share */
            wait = until < tat + FILL_OWED_NS + 1 ? until : tat + FILL_OWED_NS + 1;
        else
            wait = borrow_wait(g, now, q);
        if (wait == BORROW_LATE) {
            if (!owed) { /* another context has work the relay has not told of yet: give way for a while */
                give_way(g, now);
                continue;
            }
            wait = q > now + LENT_AHEAD_NS ? q - LENT_AHEAD_NS : 0; /* owed: the queue bound only */
        }
        if (!wait) {
            __atomic_store_n(&g->lent_qend_ns, q + cost, __ATOMIC_RELAXED);
            /* its own timeline at FILL_HOLD_PCT of its limit: from at most a period back, a period ahead */
            uint64_t base = tat + period > now ? tat : now - period;
            uint64_t next = base + cost * 1000000 / (rate_ppm(g) * FILL_HOLD_PCT / 100 + 1);
            __atomic_store_n(&g->fill_tat_ns, next < now + period ? next : now + period, __ATOMIC_RELAXED);
            *nowp = now;
            return 1;
        }
        if (wait < now + DRAIN_POLL_NS) wait = now + DRAIN_POLL_NS;
        sleep_until(wait);
        now = gs_now_ns();
    }
}

/* ------------------------------------------------------------------ outside the slot
 * (issue 39) Where the agent's relay runs for a time-sliced claim (every context on its GPU paced,
 * no Burst claim filling), it tells the claim until when the GPU's other claims have work (their
 * launches, queue ends and a margin: relay.py). Outside its slot the claim then launches:
 *  - while they have none, as a fill: at most LENT_AHEAD_NS queued beyond its running work, a
 *    marker after it, so that it gives the GPU back within a kernel when their work comes. An
 *    eager framework's step leaves the GPU idle in its host phases; with slots alone that time
 *    was lost in every slot, and a training pair at 30/70 did 24-35 / 69-77 % of what each does
 *    alone, 82-86 % of what plain time slicing gives the two (62 / 62);
 *  - how much: up to OUT_BURST_NS ahead of its timeline; a claim far behind it when its slot
 *    ended (more than a quarter of the period: its own host time left its slot idle) up to its
 *    share of the period, as in its slot. At a tenth, two launch-bound claims of 4 us kernels
 *    (each using most of its slot) filled each other's CPU-starved pauses, a context switch each
 *    way every time, and the 70 % one read 59-61 (67 before);
 *  - while they have work, only a claim that used less than half of its slot and waited for its
 *    share at no launch in the last period (an inference server's requests, which must not wait
 *    for their slot: its p99 would be up to a slot), within INTRUDE_PPM of the GPU's time
 *    (intrude_ok). A loop bound by its launches that fills half of the GPU and never waits for its
 *    share (an elementwise loop at 70) took half of a 30 % matmul neighbour's slot, which got 17 %
 *    of its solo; that loop uses most of its own slot, so it no longer launches into its
 *    neighbour's work;
 *  - else it waits for their work to end, or for its slot.
 * What it does not do: take back what others' launches took in its own slot by launching into
 * their work (the matmul beside the loop reads 26-28 %; tried: where the others use most of
 * their share and never wait for it, 29.4, but a training pair's 70 then fell to 64). */
#define INTRUDE_PPM 100000ull       /* 10 % of the GPU's time: launches into other claims' work... */
#define INTRUDE_BURST_NS 5000000ull /* ... of which this much at once */
#define SLOT_FAR 1                  /* it was far behind its timeline when its slot ended */
#define SLOT_LIGHT 2                /* it used less than half of its slot */
enum { OUT_SLOT_OPENED = -1, OUT_NO_RELAY, OUT_FILL, OUT_INTRUDE };

/* a launch into the others' work, its bucket's booking starting at base: within INTRUDE_BURST_NS,
 * and once that is spent not before the bucket is full again. A trickle at INTRUDE_PPM is the
 * dearest form: each launch then finds the neighbour at a slice end, a context switch each way */
static int intrude_ok(struct gpu_state *g, uint64_t now, uint64_t base)
{
    if (base > now + INTRUDE_BURST_NS) __atomic_store_n(&g->intrude_dry, 1, __ATOMIC_RELAXED);
    else if (base <= now) __atomic_store_n(&g->intrude_dry, 0, __ATOMIC_RELAXED);
    return !__atomic_load_n(&g->intrude_dry, __ATOMIC_RELAXED);
}

/* the comment above; *far: it may book up to its next slot */
static int out_of_slot_turn(struct gpu_state *g, uint64_t *nowp, uint64_t start, uint64_t len, uint64_t period,
                            uint64_t cost, int *far)
{
    uint64_t now = *nowp;
    for (;;) {
        uint64_t phase = slot_phase(now, start, period), next_slot = now + period - phase, until = 0, wait;
        *nowp = now;
        if (phase < len) return OUT_SLOT_OPENED;
        if (!gs_control_owner_busy(g->control, now, &until)) return OUT_NO_RELAY;
        uint64_t tat = timeline_at(g, now), no = (now + period - start) / period;
        uint64_t seen = __atomic_load_n(&g->lent_until_ns, __ATOMIC_RELAXED); /* its marker saw their work */
        if (seen > until) until = seen;
        uint64_t view = __atomic_load_n(&g->slot_view, __ATOMIC_RELAXED);
        if (view >> 2 != no) { /* its first look since its slot ended */
            view = no << 2 | (tat + period / 4 < next_slot ? SLOT_FAR : 0) | (tat + period / 2 < next_slot ? SLOT_LIGHT : 0);
            __atomic_store_n(&g->slot_view, view, __ATOMIC_RELAXED);
        }
        *far = (view & SLOT_FAR) != 0;
        uint64_t to = *far ? next_slot : now + OUT_BURST_NS; /* how far ahead of its timeline it may book */
        if (tat >= next_slot) {
            wait = next_slot;
        } else if (tat > to) {
            wait = tat - OUT_BURST_NS;
        } else if (now < until) { /* their work */
            uint64_t itat = __atomic_load_n(&g->intrude_tat_ns, __ATOMIC_RELAXED), base = itat > now ? itat : now;
            if ((view & SLOT_LIGHT) && tat <= now + OUT_BURST_NS &&
                __atomic_load_n(&g->held_ns, __ATOMIC_RELAXED) + period < now && intrude_ok(g, now, base)) {
                __atomic_store_n(&g->intrude_tat_ns, base + cost * 1000000 / INTRUDE_PPM, __ATOMIC_RELAXED);
                *far = 0;
                return OUT_INTRUDE;
            }
            wait = until;
        } else {
            uint64_t q = __atomic_load_n(&g->lent_qend_ns, __ATOMIC_RELAXED);
            if (q < now) q = now;
            wait = borrow_wait(g, now, q);
            if (wait == BORROW_LATE) { /* work the relay has not told of yet: give way for a while */
                give_way(g, now);
                continue;
            }
            if (!wait) {
                __atomic_store_n(&g->lent_qend_ns, q + cost, __ATOMIC_RELAXED);
                return OUT_FILL;
            }
        }
        if (wait > next_slot) wait = next_slot;
        if (wait < now + DRAIN_POLL_NS) wait = now + DRAIN_POLL_NS;
        sleep_until(wait);
        now = gs_now_ns();
    }
}

static void pace_begin(struct launch *L, CUstream s, int ptsz, int kind, uintptr_t key)
{
    L->g = NULL;
    L->sampling = 0;
    L->lent = 0;
    ensure_cuda();
    if (g_launch_mode != LAUNCH_PACE) return;
    struct gpu_state *g = current_gpu();
    if (!g || g->failed || g->compute >= 100) return;
    int captures = __atomic_load_n(&g_captures, __ATOMIC_RELAXED) > 0;
    if (captures && capturing(s, ptsz)) return; /* it goes into a graph: nothing runs now */
    L->g = g;
    L->kind = kind;
    L->ptsz = ptsz;
    L->stream = s;
    L->key = key;

    uint64_t now = gs_now_ns();
    uint64_t cost = cost_of(g, kind, key);
    if (g->mps && cost) cost = cost * mps_scale(g) / 1000000 + 1; /* SM-time; never 0 (= not measured) */
    if (cost) {
        uint64_t start = 0, len = 0, period = 0, ahead = BURST_NS, next_slot = 0;
        int slotted = g->control && gs_control_slot(g->control, &start, &len, &period);
        /* the fill (above): a Burst claim of one time-sliced process behind Hard claims */
        int fill = slotted && gs_control_lent(g->control) >= period;
        if (fill && !g->mps && !gs_control_unpaced(g->control) && gs_control_procs(g->control) == 1 && !captures &&
            !__atomic_load_n(&g->lent_off, __ATOMIC_RELAXED) && fill_turn(g, &now, period, cost)) {
            L->lent = 1;
            charge(g, cost);
            goto sample;
        }
        if (fill) slotted = 0; /* no relay, or no fill for this process: its limit, no slot */
        /* the slot handover: time-sliced claims only (an MPS server's clients are one context),
         * and only where every context on the GPU is paced: beside a claim of strategy None or
         * an MPS server the slots do not keep the claims apart, and draining before the slot's
         * end only cost the claim its share (a TimeSlicing claim of 25 beside both: 19.3-19.8 %
         * with the handover, 24.9-25.2 without). Several processes of a claim take turns in its
         * slot (turn_take); the lent span is for a claim of one */
        int handover_here = slotted && !g->mps && !gs_control_unpaced(g->control);
        int several = handover_here && gs_control_procs(g->control) > 1;
        int forged_turn = several && __atomic_load_n(&g->turn_off, __ATOMIC_RELAXED);
        uint32_t me = several && !forged_turn ? turn_token(g) : 0; /* turns (above) */
        int in_slot = 0, far = 0, handover = handover_here && !forged_turn;
        uint64_t lent = handover && !several && !captures && !__atomic_load_n(&g->lent_off, __ATOMIC_RELAXED)
                        ? gs_control_lent(g->control) : 0;
    again:
        if (lent && lent_turn(g, &now, start, lent, period, cost)) { /* lent: not on the timeline */
            L->lent = 1;
            charge(g, cost);
        } else {
            uint64_t floor = now;
            if (slotted) { /* in the slot: up to the next slot's start, a period's worth */
                if (handover && slot_phase(now, start, period) < len) {
                    now = slot_turn(g, s, ptsz, captures, now, start, len, lent, period, cost, me);
                    if (lent && slot_phase(now, start, period) >= len) goto again; /* it went on to the lent span */
                }
                if (handover && !lent && !captures && !several && slot_phase(now, start, period) >= len) {
                    int out = out_of_slot_turn(g, &now, start, len, period, cost, &far); /* (above) */
                    if (out == OUT_SLOT_OPENED) goto again;
                    L->lent = out == OUT_FILL; /* marked as borrowed work */
                    far = far && out == OUT_FILL;
                }
                uint64_t phase = slot_phase(now, start, period); /* since the slot began */
                in_slot = phase < len;
                next_slot = now + period - phase;
                ahead = in_slot || far ? period - phase : OUT_BURST_NS; /* far behind: up to its next slot */
                if (in_slot) floor = now - phase; /* a late wake-up does not cost the claim its time */
                if (lent) { /* a booking that would wait for the next slot waits, unbooked, for the lent
                             * span before it */
                    if (timeline_at(g, now) > now + ahead) {
                        mark_drain(g, s, ptsz, captures);
                        now = hold_until(g, now, now + slot_phase(start + period - lent, now % period, period));
                        goto again;
                    }
                }
            }
            uint64_t rate = rate_ppm(g);
            uint64_t interval = cost * 1000000 / rate;
            if (in_slot && __atomic_exchange_n(&g->switch_owed, 0, __ATOMIC_RELAXED)) interval += SWITCH_NS * 1000000 / rate;
            uint64_t base = book_shared(g, now, floor, interval);
            int forged = __atomic_load_n(&g->forged, __ATOMIC_RELAXED);
            uint64_t alone = forged && g->control ? gs_control_procs(g->control) : 1;
            /* forged: a GCRA of its own that may catch up a period it lost waiting for its slot */
            uint64_t tolerance = slotted ? period : BURST_NS;
            uint64_t mine = book(&g->my_tat_ns, now, forged && now > tolerance ? now - tolerance : floor, interval * alone);
            if (mine > base) base = mine;
            charge(g, cost);
            if (base > now + ahead) {
                /* slotted: at the latest when a slot opens in which the booking fits (a period's worth
                 * from its start). Waking at the next slot whatever was booked let each waiting process
                 * launch once a period: a claim's processes together, or one whose launch costs more
                 * than a period of its rate, took more than the share (4 MPS clients of a 25 % claim:
                 * 46 % of the work beside a neighbour) */
                uint64_t wake = base - ahead;
                if (slotted) {
                    uint64_t opens = next_slot;
                    if (base > opens + period) opens += (base - opens - period + period - 1) / period * period;
                    if (in_slot || opens < wake) wake = opens;
                }
                if (handover) mark_drain(g, s, ptsz, captures);
                now = hold_until(g, now, wake);
                if (handover && slot_phase(now, start, period) < len) /* a new slot: its first launch */
                    now = slot_turn(g, s, ptsz, captures, now, start, len, lent, period, cost, me);
            }
            if (forged) { /* the private bucket alone holds the claim: a plain GCRA, no slot shortcut */
                if (mine > now + tolerance) {
                    uint64_t wake = mine - tolerance;
                    if (slotted) { /* in the claim's slot, as its other launches (clean cost samples) */
                        uint64_t phase = slot_phase(wake, start, period);
                        if (phase >= len) wake += period - phase;
                    }
                    now = hold_until(g, now, wake);
                }
            }
            if (handover) { /* the predicted end of this process's queued work; a marker every MARK_NS of it */
                uint64_t q = __atomic_load_n(&g->qend_ns, __ATOMIC_RELAXED);
                if (in_slot && q > now + QUEUE_NS) { /* a shallow queue: its markers tell late work early */
                    now = hold_until(g, now, q - QUEUE_NS);
                }
                if (in_slot) { /* its wait for the queue finds how late the queue is: q moves with it */
                    now = queue_bound(g, now, captures, now - slot_phase(now, start, period) + len);
                    q = __atomic_load_n(&g->qend_ns, __ATOMIC_RELAXED);
                }
                if (!__atomic_load_n(&g->drain.pending, __ATOMIC_ACQUIRE) && q >= now + MARK_NS) mark_drain(g, s, ptsz, captures);
                __atomic_store_n(&g->qend_ns, (q > now ? q : now) + cost, __ATOMIC_RELAXED);
                __atomic_store_n(&g->region.hdr->pace_qend_ns, (q > now ? q : now) + cost, __ATOMIC_RELAXED);
                if (me && in_slot) turn_renew(g, me, (q > now ? q : now) + cost + TURN_IDLE_NS, 0);
            }
        }
    }
sample:
    if (captures || (cost && now < __atomic_load_n(&g->next_sample_ns, __ATOMIC_RELAXED)) ||
        pthread_mutex_trylock(&g->sample_lock) != 0)
        return;
    if (g->pending) finish_sample(g);
    if (!g->pending && (!g->ev0 || !g->ev1)) {
        if (real_cuEventCreate(&g->ev0, CU_EVENT_DEFAULT) != CUDA_SUCCESS) g->ev0 = NULL;
        if (real_cuEventCreate(&g->ev1, CU_EVENT_DEFAULT) != CUDA_SUCCESS) g->ev1 = NULL;
    }
    /* capturing() again: a capture begun where we cannot see it (cuStreamBeginCaptureToGraph) */
    if (!g->pending && g->ev0 && g->ev1 && !capturing(s, ptsz) && record(g->ev0, s, ptsz) == CUDA_SUCCESS) {
        L->sampling = 1; /* keep sample_lock until pace_end */
        return;
    }
    __atomic_store_n(&g->next_sample_ns, now + SAMPLE_NS, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g->sample_lock);
}

/* after the real launch, which returned rc: finish a sample begun by pace_begin; returns rc */
static CUresult pace_end(struct launch *L, CUresult rc)
{
    if (L->lent && rc == CUDA_SUCCESS) lent_mark(L->g, L->stream, L->ptsz);
    if (!L->sampling) return rc;
    struct gpu_state *g = L->g;
    if (rc == CUDA_SUCCESS && record(g->ev1, L->stream, L->ptsz) == CUDA_SUCCESS) {
        g->pending = 1;
        g->pending_kind = L->kind;
        g->pending_key = L->key;
        g->pending_upper = !__atomic_load_n(&g_captures, __ATOMIC_RELAXED) && real_cuEventQuery(g->ev0) == CUDA_SUCCESS;
        if (!__atomic_load_n(&g->cost_ns[L->kind], __ATOMIC_RELAXED) &&
            !__atomic_load_n(&g_captures, __ATOMIC_RELAXED)) { /* first: wait for it */
            real_cuEventSynchronize(g->ev1);
            finish_sample(g);
        }
    } else if (rc == CUDA_SUCCESS) { /* events of another context: make new ones next time */
        real_cuEventDestroy_v2(g->ev0);
        real_cuEventDestroy_v2(g->ev1);
        g->ev0 = g->ev1 = NULL;
    }
    __atomic_store_n(&g->next_sample_ns, gs_now_ns() + SAMPLE_NS, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g->sample_lock);
    return rc;
}

/* ------------------------------------------------------------------ the launch hooks
 * Each: when no GPU of the claim is paced (compute 100, or no claim), straight to the driver
 * (a tail call); else pace_begin, the real launch, pace_end. */

static inline int launch_unpaced(void)
{
    return __atomic_load_n(&g_launch_mode, __ATOMIC_ACQUIRE) == LAUNCH_PASS;
}

/* a kernel's cost key: the function and its grid size */
static inline uintptr_t kernel_key(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz)
{
    return (uintptr_t)f ^ ((uintptr_t)gx * gy * gz << 20);
}

static inline uintptr_t kernel_key_ex(const CUlaunchConfig *cfg, CUfunction f)
{
    return cfg ? kernel_key(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ) : (uintptr_t)f;
}

HOOK CUresult cuLaunchKernel(GS_LAUNCH_ARGS, void **extra)
{
    if (LIKELY(launch_unpaced())) return real_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
    struct launch L;
    pace_begin(&L, s, 0, KIND_KERNEL, kernel_key(f, gx, gy, gz));
    return pace_end(&L, real_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));
}

HOOK CUresult cuLaunchKernel_ptsz(GS_LAUNCH_ARGS, void **extra)
{
    if (LIKELY(launch_unpaced())) return real_cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
    struct launch L;
    pace_begin(&L, s, 1, KIND_KERNEL, kernel_key(f, gx, gy, gz));
    return pace_end(&L, real_cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));
}

HOOK CUresult cuLaunchCooperativeKernel(GS_LAUNCH_ARGS)
{
    if (LIKELY(launch_unpaced())) return real_cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params);
    struct launch L;
    pace_begin(&L, s, 0, KIND_KERNEL, kernel_key(f, gx, gy, gz));
    return pace_end(&L, real_cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params));
}

HOOK CUresult cuLaunchCooperativeKernel_ptsz(GS_LAUNCH_ARGS)
{
    if (LIKELY(launch_unpaced()))
        return real_cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params);
    struct launch L;
    pace_begin(&L, s, 1, KIND_KERNEL, kernel_key(f, gx, gy, gz));
    return pace_end(&L, real_cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params));
}

HOOK CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    if (LIKELY(launch_unpaced())) return real_cuLaunchKernelEx(cfg, f, params, extra);
    struct launch L;
    pace_begin(&L, cfg ? cfg->hStream : NULL, 0, KIND_KERNEL, kernel_key_ex(cfg, f));
    return pace_end(&L, real_cuLaunchKernelEx(cfg, f, params, extra));
}

HOOK CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    if (LIKELY(launch_unpaced())) return real_cuLaunchKernelEx_ptsz(cfg, f, params, extra);
    struct launch L;
    pace_begin(&L, cfg ? cfg->hStream : NULL, 1, KIND_KERNEL, kernel_key_ex(cfg, f));
    return pace_end(&L, real_cuLaunchKernelEx_ptsz(cfg, f, params, extra));
}

/* a graph launch is charged at the graph's own measured replay cost */
HOOK CUresult cuGraphLaunch(CUgraphExec ge, CUstream s)
{
    if (LIKELY(launch_unpaced())) return real_cuGraphLaunch(ge, s);
    struct launch L;
    pace_begin(&L, s, 0, KIND_GRAPH, (uintptr_t)ge);
    return pace_end(&L, real_cuGraphLaunch(ge, s));
}

HOOK CUresult cuGraphLaunch_ptsz(CUgraphExec ge, CUstream s)
{
    if (LIKELY(launch_unpaced())) return real_cuGraphLaunch_ptsz(ge, s);
    struct launch L;
    pace_begin(&L, s, 1, KIND_GRAPH, (uintptr_t)ge);
    return pace_end(&L, real_cuGraphLaunch_ptsz(ge, s));
}
