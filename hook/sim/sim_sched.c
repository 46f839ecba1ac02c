/* Time-sliced contexts, as on a real GPU (calibration to the H100: docs/compute.md).
 *
 * Each process has one queue of work per device (its streams share it). While several
 * processes have work queued, the device alternates between their contexts in slices of
 * slice_ns (GPUSHARE_SIM_SLICE_US): a kernel is preempted when its context's slice ends and
 * another context is waiting, so its event pair also counts the others' slices. The H100 showed
 * three more things, each modelled here:
 *  - a context switch costs: whenever the device turns to another context, and at every slice
 *    end where another context waits, nothing runs for switch_ns (GPUSHARE_SIM_SWITCH_US);
 *  - slices end on the device's clock, every slice_ns whoever is resident (a context that got
 *    the device late in one has the rest of it), so a context that gets work while another runs
 *    waits for the next slice end, never takes the device at once. A resident that runs out of
 *    work hands the device over at once (the GPU is work conserving);
 *  - a preempted kernel may wait across two slice ends: at again_ppm of the slice ends where
 *    the waiting context was preempted with work left (GPUSHARE_SIM_WAIT_AGAIN_PCT), the
 *    resident keeps the device one more slice (after the same switch cost). A context that
 *    comes with new work is not held so (on the H100 an inference client beside a busy
 *    neighbour waited at most about one slice, a preempted matmul up to two). Which ends: a
 *    hash of their count, the same in every run.
 *
 * The clients of one MPS server (sim_mps.h) are one context: while it is resident, each client
 * with work runs at the same time at its own rate (runners(), below), so a queue's work advances
 * at a rate that changes only when a client starts or stops, or a kernel of another SM demand
 * comes up (the queue keeps where its demand changes).
 *
 * The schedule is computed lazily: every call that enqueues or observes work first advances
 * the device's schedule to now under its lock. Work arrives only at such calls, so the lazy
 * schedule equals the eager one.
 *
 * NVML's per-process utilization is sampled like the real driver's: every sample_ns the
 * device records one sample naming the context resident at that instant, with the device's
 * busy share over the sample period; a query averages the samples newer than its timestamp. */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "sim_state.h"

static struct sim_queue *queue_of(int p, int dev) { return &sim->proc[p].q[dev]; }

/* proc[] entries in use lie below this (registrations take the lowest free entry) */
static int procs(void) { return (int)__atomic_load_n(&sim->proc_hw, __ATOMIC_RELAXED); }

static int has_work(int p, int dev)
{
    struct sim_queue *q = queue_of(p, dev);
    return sim->proc[p].in_use && q->queued_ns > q->done_ns;
}

/* one context on the device: a process, or every client of one MPS server */
static int same_ctx(int a, int b)
{
    if (a == b) return 1;
    if (a < 0 || b < 0) return 0;
    uint64_t m = sim->proc[a].mps_server;
    return m && m == sim->proc[b].mps_server;
}

static int ctx_has_work(int r, int dev)
{
    if (!sim->proc[r].mps_server) return has_work(r, dev);
    for (int p = 0, n = procs(); p < n; p++)
        if (same_ctx(p, r) && has_work(p, dev)) return 1;
    return 0;
}

/* the next process after `after` (round robin) with work, of another context; -1 none */
static int next_waiting(int dev, int after)
{
    int n = procs();
    for (int k = 1; k <= n; k++) {
        int p = ((after < 0 ? -1 : after) + k + n) % n;
        if (!same_ctx(p, after) && has_work(p, dev)) return p;
    }
    return -1;
}
static uint64_t realtime_us(uint64_t mono_ns)
{
    struct timespec r, m;
    clock_gettime(CLOCK_REALTIME, &r);
    clock_gettime(CLOCK_MONOTONIC, &m);
    int64_t off = ((int64_t)r.tv_sec - m.tv_sec) * 1000000000ll + (r.tv_nsec - m.tv_nsec);
    return (uint64_t)((int64_t)mono_ns + off) / 1000;
}

/* NVML samples at the instants in (s->t, end], while `rate` (0 idle, 1 running) holds */
static void take_samples(struct sim_sched *s, uint64_t end, int rate)
{
    uint64_t period = sim->sample_ns;
    while (s->next_sample <= end) {
        uint64_t x = s->next_sample;
        uint64_t busy = s->busy_ns + (rate ? x - s->t : 0);
        uint64_t util = (busy - s->sample_busy) * 100 / period;
        if (util > 0 && s->resident >= 0) {
            struct sim_sample *o = &s->samples[s->nsamples++ % SIM_SAMPLES];
            o->t_us = realtime_us(x);
            o->slot = s->resident; /* NVML answers it as the caller's pid */
            o->util = util > 100 ? 100 : (uint32_t)util;
        }
        s->sample_busy = busy;
        /* the driver's sampling clock is not in step with anyone's schedule: a little drift */
        s->next_sample = x + period + (x / 1000 * 2654435761u) % (period / 16);
        if (!rate && end - x > 2 * period) /* long idle: nothing more to say until end */
            s->next_sample = end - end % period + period;
    }
}

/* the SM demand of q's work at its done position, and the GPU ns left before it changes */
static uint32_t demand_now(struct sim_queue *q, uint64_t *left)
{
    uint32_t ppm = SIM_FULL, n = q->ndemand, k = n > SIM_DEMANDS ? SIM_DEMANDS : n;
    *left = q->queued_ns - q->done_ns;
    for (uint32_t i = 1; i <= k; i++) {
        struct sim_demand *d = &q->demand[(n - i) % SIM_DEMANDS];
        if (d->from <= q->done_ns) {
            ppm = d->ppm;
            break;
        }
        if (d->from - q->done_ns < *left) *left = d->from - q->done_ns;
    }
    return ppm;
}

/* MPS (calibration: docs/compute.md). Each client's kernel takes the SMs it asks for up to its
 * active-thread share (scaled down together when they ask for more than the GPU has) and runs
 * at (SMs it got) / (SMs it asked for) of its solo speed, times MPS_HELD_PPM when its share is
 * fewer SMs than it asked for (clients that only ask together for more than the GPU has are not
 * held so); kernels of clients running together lose MPS_LOSS_PPM times the share of the SMs in
 * use, to the memory system they share. The H100 (2026-11-22): 30/70 clients of large
 * matmuls did 75 % of solo work together (0.82 x (1 - 0.085)), the 30-client 30.1 % of it. */
#define MPS_LOSS_PPM 85000u
/* a kernel held to fewer SMs than its grid asks for (by its client's share) runs at this part of
 * (SMs got) / (SMs asked): the H100 ran a client at 30 % alone at 24.6 % of solo */
#define MPS_HELD_PPM 820000u

/* who of r's context runs now and at what rate (ppm GPU-ns per ns); left: GPU ns until its
 * demand changes. Returns how many. */
static int runners(int dev, int r, int *who, uint32_t *rate, uint64_t *left)
{
    if (!sim->proc[r].mps_server) {
        uint64_t l;
        demand_now(queue_of(r, dev), &l);
        who[0] = r, rate[0] = SIM_FULL, left[0] = l;
        return 1;
    }
    uint32_t ask[SIM_MAX_PROC], got[SIM_MAX_PROC];
    uint64_t sum = 0;
    int n = 0;
    for (int p = 0, np = procs(); p < np; p++) {
        if (!same_ctx(p, r) || !has_work(p, dev)) continue;
        ask[n] = demand_now(queue_of(p, dev), &left[n]);
        if (ask[n] == 0) ask[n] = 1;
        uint32_t share = sim->proc[p].mps_threads_ppm ? sim->proc[p].mps_threads_ppm : SIM_FULL;
        got[n] = ask[n] < share ? ask[n] : share;
        sum += got[n];
        who[n++] = p;
    }
    uint64_t used = sum > SIM_FULL ? SIM_FULL : sum;
    uint64_t keep = n > 1 ? SIM_FULL - (uint64_t)MPS_LOSS_PPM * used / SIM_FULL : SIM_FULL;
    for (int i = 0; i < n; i++) {
        uint64_t g = sum > SIM_FULL ? (uint64_t)got[i] * SIM_FULL / sum : got[i];
        uint64_t x = g * keep / ask[i];
        if (got[i] < ask[i]) x = x * MPS_HELD_PPM / SIM_FULL; /* held by its share, not by the others */
        rate[i] = x < 1 ? 1 : x > SIM_FULL ? SIM_FULL : (uint32_t)x;
    }
    return n;
}

static uint64_t at_rate(uint64_t gpu_ns, uint32_t ppm) { return (gpu_ns * SIM_FULL + ppm - 1) / ppm; }

/* a slice end with a context waiting: 1 if the resident gets one more slice */
static int again(struct sim_sched *s)
{
    uint64_t h = ++s->boundaries * 0x9e3779b97f4a7c15ull; /* splitmix64: no pattern in the count shows */
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h % SIM_FULL < sim->again_ppm;
}

/* the device's slice ends: every slice_ns on its clock, whoever is resident */
static uint64_t next_boundary(uint64_t t) { return t - t % sim->slice_ns + sim->slice_ns; }

/* context r takes the device (or keeps it for another slice): nothing runs for switch_ns. A
 * resident that loses it with work left is preempted until it has the device again. */
static void switch_to(struct sim_sched *s, int dev, int r)
{
    if (s->resident >= 0 && !same_ctx(s->resident, r) && ctx_has_work(s->resident, dev))
        queue_of(s->resident, dev)->preempted = 1;
    queue_of(r, dev)->preempted = 0;
    s->resident = r;
    s->switch_end = s->t + sim->switch_ns;
}

/* under the lock: compute the schedule up to now */
static void advance(int dev, uint64_t now)
{
    struct sim_sched *s = &sim->dev[dev].sched;
    int who[SIM_MAX_PROC];
    uint32_t rate[SIM_MAX_PROC];
    uint64_t left[SIM_MAX_PROC];
    if (s->next_sample == 0) s->next_sample = now - now % sim->sample_ns + sim->sample_ns;
    if (s->t == 0) s->t = now;
    while (s->t < now) {
        int r = s->resident;
        int r_work = r >= 0 && ctx_has_work(r, dev);
        int other = next_waiting(dev, r);
        int n = 0;
        if (s->t >= s->switch_end) {
            if (!r_work && other < 0) { /* idle until now */
                take_samples(s, now, 0);
                s->t = now;
            } else if (!r_work) { /* the resident ran dry: the device turns to the waiting one */
                switch_to(s, dev, other);
            } else if (other >= 0 && s->t % sim->slice_ns == 0) {
                /* a slice end with one waiting; a preempted kernel may wait a second slice */
                switch_to(s, dev, queue_of(other, dev)->preempted && again(s) ? r : other);
            }
        }
        if (s->t >= now) break;
        r = s->resident;
        uint64_t end = now;
        if (s->t < s->switch_end) { /* switching: nothing runs */
            if (s->switch_end < end) end = s->switch_end;
        } else {
            n = runners(dev, r, who, rate, left);
            /* the stretch ends at now, the slice's end, or the first change of a runner's demand */
            for (int i = 0; i < n; i++)
                if (s->t + at_rate(left[i], rate[i]) < end) end = s->t + at_rate(left[i], rate[i]);
            if (other >= 0 && next_boundary(s->t) < end) end = next_boundary(s->t);
        }
        take_samples(s, end, n > 0);
        uint64_t dt = end - s->t;
        for (int p = 0, i, np = procs(); p < np; p++) {
            struct sim_queue *q = queue_of(p, dev);
            for (i = 0; i < n && who[i] != p; i++) {}
            if (i == n) { /* not running in this stretch */
                q->run_ppm = 0;
                continue;
            }
            if (q->run_ppm != rate[i]) /* starts running, or at another rate: for its event times */
                q->seg[q->nseg++ % SIM_SEGMENTS] = (struct sim_seg){s->t, q->done_ns, rate[i], 0};
            q->run_ppm = rate[i];
            uint64_t done = s->t + at_rate(left[i], rate[i]) == end ? left[i] : dt * rate[i] / SIM_FULL;
            if (done > left[i]) done = left[i];
            for (int w = 0; w < SIM_WATCHES; w++) /* events reached in this stretch */
                if (!q->watch[w].t0 && q->watch[w].done0 > q->done_ns && q->watch[w].done0 <= q->done_ns + done)
                    q->watch[w].t0 = s->t + at_rate(q->watch[w].done0 - q->done_ns, rate[i]);
            q->done_ns += done;
            if (q->done_ns == q->queued_ns) q->run_ppm = 0; /* drained: new work starts a new stretch */
            __atomic_store_n(&sim->proc[p].busy_ns[dev], q->done_ns, __ATOMIC_RELAXED);
        }
        if (n) s->busy_ns += dt;
        s->t = end;
    }
}

static struct sim_sched *lock_dev(int dev, uint64_t now)
{
    struct sim_sched *s = &sim->dev[dev].sched;
    sim_robust_lock(&s->lock.m);
    advance(dev, now);
    return s;
}

static int me(void) { return (int)(sim_me - sim->proc); }

/* under the lock: work from q's queued position on asks for ppm of the SMs. With SIM_DEMANDS
 * changes already ahead of the schedule, the newest stays in force (a lossy corner: a process
 * alternating kernel sizes more than that far ahead). */
static void set_demand(struct sim_queue *q, uint32_t ppm)
{
    uint32_t n = q->ndemand;
    if (ppm == 0 || (n && q->demand[(n - 1) % SIM_DEMANDS].ppm == ppm)) return;
    if (n >= SIM_DEMANDS && q->demand[(n - SIM_DEMANDS + 1) % SIM_DEMANDS].from > q->done_ns) return;
    q->demand[n % SIM_DEMANDS] = (struct sim_demand){q->queued_ns, ppm, 0};
    q->ndemand = n + 1;
}

uint64_t sim_enqueue(int dev, uint64_t ns, uint32_t demand_ppm)
{
    struct sim_sched *s = lock_dev(dev, sim_now_ns());
    struct sim_queue *q = queue_of(me(), dev);
    set_demand(q, demand_ppm);
    q->queued_ns += ns;
    uint64_t pos = q->queued_ns;
    pthread_mutex_unlock(&s->lock.m);
    return pos;
}

uint64_t sim_enqueue_watched(int dev, uint64_t ns, uint32_t *watch, struct sim_seg *evicted)
{
    struct sim_sched *s = lock_dev(dev, sim_now_ns());
    struct sim_queue *q = queue_of(me(), dev);
    q->queued_ns += ns;
    *watch = q->nwatch++ % SIM_WATCHES;
    *evicted = q->watch[*watch];
    q->watch[*watch] = (struct sim_seg){0, q->queued_ns, 0, 0};
    uint64_t pos = q->queued_ns;
    pthread_mutex_unlock(&s->lock.m);
    return pos;
}

uint64_t sim_position(int dev)
{
    return __atomic_load_n(&queue_of(me(), dev)->queued_ns, __ATOMIC_RELAXED);
}

int sim_done(int dev, uint64_t pos)
{
    if (__atomic_load_n(&queue_of(me(), dev)->done_ns, __ATOMIC_RELAXED) >= pos) return 1;
    struct sim_sched *s = lock_dev(dev, sim_now_ns());
    int done = queue_of(me(), dev)->done_ns >= pos;
    pthread_mutex_unlock(&s->lock.m);
    return done;
}

/* under the lock: the earliest the queue can reach pos (done below it), if nothing else changes.
 * Resident: when the rest has run alone. Waiting: when the resident runs dry or the slice ends,
 * whichever is first, a switch, then the rest. A real driver spins on the completion; a wait
 * that only looked again every so often read a request late by up to that step (a client's
 * p99 beside a busy context by up to its request's length, with the CPU's own wake-up on top). */
static uint64_t earliest_done(struct sim_sched *s, int dev, uint64_t done, uint64_t pos)
{
    int r = s->resident;
    uint64_t t = s->t > s->switch_end ? s->t : s->switch_end;
    if (r < 0 || same_ctx(r, me())) return t + (pos - done);
    struct sim_queue *rq = queue_of(r, dev);
    uint64_t dry = t + (rq->queued_ns - rq->done_ns), end = next_boundary(s->t);
    return (dry < end ? dry : end) + sim->switch_ns + (pos - done);
}

void sim_wait(int dev, uint64_t pos)
{
    for (;;) {
        struct sim_sched *s = lock_dev(dev, sim_now_ns());
        uint64_t done = queue_of(me(), dev)->done_ns;
        uint64_t at = done < pos ? earliest_done(s, dev, done, pos) : 0;
        pthread_mutex_unlock(&s->lock.m);
        if (done >= pos) return;
        sim_sleep_until(at);
    }
}

/* when the queue reached pos (which it has): its watch's timestamp; else the latest stretch of
 * running that began below pos ran straight to it. Not before `floor` (when it was recorded). */
uint64_t sim_pos_time(int dev, uint64_t pos, uint32_t watch, uint64_t floor)
{
    struct sim_sched *s = &sim->dev[dev].sched;
    sim_robust_lock(&s->lock.m);
    struct sim_queue *q = queue_of(me(), dev);
    uint64_t t = 0;
    if (watch < SIM_WATCHES && q->watch[watch].done0 == pos && q->watch[watch].t0) { /* timestamped */
        t = q->watch[watch].t0;
        pthread_mutex_unlock(&s->lock.m);
        return t > floor ? t : floor;
    }
    /* more events in flight than watches: from the stretches of running */
    uint32_t n = q->nseg, k = n > SIM_SEGMENTS ? SIM_SEGMENTS : n;
    for (uint32_t i = 1; i <= k; i++) {
        struct sim_seg *g = &q->seg[(n - i) % SIM_SEGMENTS];
        t = g->t0; /* older than the ring: the oldest start we still know */
        if (g->done0 < pos) {
            t = g->t0 + at_rate(pos - g->done0, g->ppm ? g->ppm : SIM_FULL);
            break;
        }
    }
    pthread_mutex_unlock(&s->lock.m);
    return t > floor ? t : floor;
}

uint64_t sim_busy_done(int dev)
{
    return __atomic_load_n(&sim->dev[dev].sched.busy_ns, __ATOMIC_RELAXED);
}

unsigned sim_samples(int dev, uint64_t since_us, int32_t *slots, unsigned *util, uint64_t *last_us, unsigned max)
{
    struct sim_sched *s = lock_dev(dev, sim_now_ns());
    unsigned n = 0, total = 0, sum[SIM_SAMPLES];
    uint32_t k = s->nsamples > SIM_SAMPLES ? SIM_SAMPLES : s->nsamples;
    *last_us = since_us;
    for (uint32_t i = 0; i < k; i++) {
        struct sim_sample *x = &s->samples[(s->nsamples - 1 - i) % SIM_SAMPLES];
        if (x->t_us <= since_us) break;
        total++;
        if (x->t_us > *last_us) *last_us = x->t_us;
        unsigned j = 0;
        while (j < n && slots[j] != x->slot) j++;
        if (j == n) {
            if (n == max) continue;
            slots[n] = x->slot;
            sum[n++] = 0;
        }
        sum[j] += x->util;
    }
    /* samples at 0 % are not kept: a period counts even when no process is in it */
    uint64_t span = 0;
    if (total) {
        uint64_t oldest = *last_us;
        for (uint32_t i = 0; i < k; i++) {
            struct sim_sample *x = &s->samples[(s->nsamples - 1 - i) % SIM_SAMPLES];
            if (x->t_us <= since_us) break;
            oldest = x->t_us;
        }
        span = (*last_us - oldest) / (sim->sample_ns / 1000) + 1;
    }
    pthread_mutex_unlock(&s->lock.m);
    for (unsigned j = 0; j < n; j++) util[j] = span ? (unsigned)(sum[j] / span) : 0;
    return n;
}
