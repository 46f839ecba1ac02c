/* Time-sliced contexts, as on a real GPU (calibration: docs/compute.md).
 *
 * Each process has one queue of work per device (its streams share it). While several
 * processes have work queued, the device alternates between their contexts in slices of
 * slice_ns (GPUSHARE_SIM_SLICE_US, 2.5 ms by default): a kernel is preempted when its context's
 * slice ends and another context is waiting, so its event pair also counts the others' slices.
 * A context that gets work after its neighbour's slice has already run out takes the device at
 * once (the neighbour's slice started long ago); there is no switch cost.
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

void sim_sched_init(struct sim_sched *s)
{
    gs_robust_mutex_init(&s->lock.m);
    s->resident = s->running = -1;
}

static struct sim_queue *queue_of(int p, int dev) { return &sim->proc[p].q[dev]; }

static int has_work(int p, int dev)
{
    struct sim_queue *q = queue_of(p, dev);
    return sim->proc[p].in_use && q->queued_ns > q->done_ns;
}

/* the next process after `after` (round robin) with work, other than `after`; -1 none */
static int next_waiting(int dev, int after)
{
    for (int k = 1; k <= SIM_MAX_PROC; k++) {
        int p = ((after < 0 ? -1 : after) + k + SIM_MAX_PROC) % SIM_MAX_PROC;
        if (p != after && has_work(p, dev)) return p;
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

/* under the lock: compute the schedule up to now */
static void advance(int dev, uint64_t now)
{
    struct sim_sched *s = &sim->dev[dev].sched;
    if (s->next_sample == 0) s->next_sample = now - now % sim->sample_ns + sim->sample_ns;
    if (s->t == 0) s->t = now;
    while (s->t < now) {
        int r = s->resident;
        int r_work = r >= 0 && has_work(r, dev);
        int other = next_waiting(dev, r);
        if (!r_work || (other >= 0 && s->t >= s->slice_end)) {
            if (other < 0) { /* idle until now */
                take_samples(s, now, 0);
                s->t = now;
                s->running = -1;
                break;
            }
            s->resident = r = other; /* context switch: a fresh slice */
            s->slice_end = s->t + sim->slice_ns;
        }
        struct sim_queue *q = queue_of(r, dev);
        if (s->running != r) { /* r starts running: a segment for its event times */
            q->seg[q->nseg++ % SIM_SEGMENTS] = (struct sim_seg){s->t, q->done_ns};
            s->running = r;
        }
        uint64_t end = now, left = q->queued_ns - q->done_ns;
        if (s->t + left < end) end = s->t + left;
        if (other >= 0 && s->slice_end > s->t && s->slice_end < end) end = s->slice_end;
        take_samples(s, end, 1);
        uint64_t dt = end - s->t;
        for (int w = 0; w < SIM_WATCHES; w++) /* events reached in this stretch */
            if (!q->watch[w].t0 && q->watch[w].done0 > q->done_ns && q->watch[w].done0 <= q->done_ns + dt)
                q->watch[w].t0 = s->t + (q->watch[w].done0 - q->done_ns);
        q->done_ns += dt;
        s->busy_ns += dt;
        __atomic_store_n(&sim->proc[r].busy_ns[dev], q->done_ns, __ATOMIC_RELAXED);
        s->t = end;
        if (q->done_ns == q->queued_ns) s->running = -1;
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

uint64_t sim_enqueue(int dev, uint64_t ns)
{
    struct sim_sched *s = lock_dev(dev, sim_now_ns());
    struct sim_queue *q = queue_of(me(), dev);
    q->queued_ns += ns;
    uint64_t pos = q->queued_ns;
    pthread_mutex_unlock(&s->lock.m);
    return pos;
}

uint64_t sim_enqueue_watched(int dev, uint64_t ns, uint32_t *watch)
{
    struct sim_sched *s = lock_dev(dev, sim_now_ns());
    struct sim_queue *q = queue_of(me(), dev);
    q->queued_ns += ns;
    *watch = q->nwatch++ % SIM_WATCHES;
    q->watch[*watch] = (struct sim_seg){0, q->queued_ns};
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

void sim_wait(int dev, uint64_t pos)
{
    for (;;) {
        uint64_t now = sim_now_ns();
        struct sim_sched *s = lock_dev(dev, now);
        uint64_t done = queue_of(me(), dev)->done_ns;
        pthread_mutex_unlock(&s->lock.m);
        if (done >= pos) return;
        /* at the earliest when the rest runs alone; look again at least every slice */
        uint64_t wait = pos - done < sim->slice_ns ? pos - done : sim->slice_ns;
        sim_sleep_until(now + wait);
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
            t = g->t0 + (pos - g->done0);
            break;
        }
    }
    pthread_mutex_unlock(&s->lock.m);
    return t > floor ? t : floor;
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
