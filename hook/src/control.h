/* Trusted control file: one per (claim, GPU), GS_CONTROL_SIZE bytes, created zero-filled by
 * the kubelet plugin (root, 0644) and mounted read-only, so no tenant can write it. Only the
 * node agent (root, on the host) writes it: magic and version once, then rate_ppm with single
 * aligned 32-bit stores, the slot with single 64-bit stores. Layout documented in hook/README.md and docs/interfaces.md. */
#ifndef GPUSHARE_CONTROL_H
#define GPUSHARE_CONTROL_H

#include <stdint.h>

#define GS_CONTROL_SIZE 4096u
#define GS_CONTROL_MAGIC 0x31304c5254435347ULL /* "GSCTRL01" little endian */
#define GS_CONTROL_VERSION 1u

struct gs_control {
    uint64_t magic;     /*  0: GS_CONTROL_MAGIC; 0 = the agent has not written the file yet */
    uint32_t version;   /*  8: GS_CONTROL_VERSION */
    uint32_t rate_ppm;  /* 12: refill rate, millionths of the GPU; 0 = no override */
    uint64_t slot;      /* 16: the claim's time slot on the GPU: start_us | length_us << 32,
                               one 64-bit store; length 0 = none (docs/compute.md) */
    uint32_t period_us; /* 24: period of the GPU's slot schedule (CLOCK_MONOTONIC) */
    uint32_t procs;     /* 28: the claim's processes on this GPU as the agent sees them (NVML,
                               mapped from kernel facts); 0 = unknown. A process that finds the
                               claim's shared timeline forged paces itself at rate / procs */
    uint32_t lent_us;   /* 32: a busy Burst claim's lent span, the lent_us right before its slot: the
                               idle tail of the busy Hard claim's slot before it, where it launches
                               while the GPU runs no other work (docs/compute.md); 0 = none */
    uint32_t unpaced;   /* 36: 1 = contexts nobody paces share the GPU (a claim of strategy None, an
                               MPS server): slots do not keep the claims apart there, so the
                               library paces without the slot handover (docs/compute.md) */
    uint64_t owner_busy_until_ns; /* 40: a filling Burst claim (lent_us = period_us): the GPU's Hard
                               claims have work until about then (CLOCK_MONOTONIC), as the agent's
                               relay sees their launches; one 64-bit store */
    uint64_t relay_seen_ns;       /* 48: when the relay last looked (CLOCK_MONOTONIC); a relay not seen
                               for GS_RELAY_STALE_NS is none */
};

_Static_assert(__builtin_offsetof(struct gs_control, version) == 8, "layout");
_Static_assert(__builtin_offsetof(struct gs_control, rate_ppm) == 12, "layout");
_Static_assert(__builtin_offsetof(struct gs_control, slot) == 16, "layout");
_Static_assert(__builtin_offsetof(struct gs_control, period_us) == 24, "layout");
_Static_assert(__builtin_offsetof(struct gs_control, procs) == 28, "layout");
_Static_assert(__builtin_offsetof(struct gs_control, lent_us) == 32, "layout");
_Static_assert(__builtin_offsetof(struct gs_control, unpaced) == 36, "layout");
_Static_assert(__builtin_offsetof(struct gs_control, owner_busy_until_ns) == 40, "layout");
_Static_assert(__builtin_offsetof(struct gs_control, relay_seen_ns) == 48, "layout");

#define GS_RELAY_STALE_NS 50000000ull /* the agent's relay looks every 2-10 ms (relay.py) */

/* The agent's rate, or 0 (none yet, or a header this library does not know). The agent writes
 * magic and version before the first rate, so a rate seen here comes with its header. */
static inline uint32_t gs_control_rate(const struct gs_control *c)
{
    uint32_t rate = __atomic_load_n(&c->rate_ppm, __ATOMIC_ACQUIRE);
    if (rate == 0 || __atomic_load_n(&c->magic, __ATOMIC_RELAXED) != GS_CONTROL_MAGIC ||
        __atomic_load_n(&c->version, __ATOMIC_RELAXED) != GS_CONTROL_VERSION)
        return 0;
    return rate;
}

/* The claim's slot in ns: 1 with *start, *len, *period set; 0 = none (or not valid). */
static inline int gs_control_slot(const struct gs_control *c, uint64_t *start, uint64_t *len, uint64_t *period)
{
    uint64_t slot = __atomic_load_n(&c->slot, __ATOMIC_ACQUIRE);
    uint64_t p = __atomic_load_n(&c->period_us, __ATOMIC_RELAXED);
    uint64_t s = slot & 0xffffffffu, l = slot >> 32;
    if (l == 0 || p == 0 || s >= p || l > p || __atomic_load_n(&c->magic, __ATOMIC_RELAXED) != GS_CONTROL_MAGIC)
        return 0;
    *start = s * 1000, *len = l * 1000, *period = p * 1000;
    return 1;
}

/* The agent's count of the claim's processes on the GPU, at least 1 (1 = none known). */
static inline uint32_t gs_control_procs(const struct gs_control *c)
{
    uint32_t n = __atomic_load_n(&c->procs, __ATOMIC_RELAXED);
    if (n == 0 || __atomic_load_n(&c->magic, __ATOMIC_RELAXED) != GS_CONTROL_MAGIC) return 1;
    return n > 4096 ? 4096 : n;
}

/* 1 when contexts nobody paces share the claim's GPU, as the agent says. */
static inline int gs_control_unpaced(const struct gs_control *c)
{
    return __atomic_load_n(&c->unpaced, __ATOMIC_RELAXED) == 1 &&
           __atomic_load_n(&c->magic, __ATOMIC_RELAXED) == GS_CONTROL_MAGIC;
}

/* The claim's lent span right before its slot in ns, 0 = none. */
static inline uint64_t gs_control_lent(const struct gs_control *c)
{
    uint64_t l = __atomic_load_n(&c->lent_us, __ATOMIC_RELAXED);
    if (__atomic_load_n(&c->magic, __ATOMIC_RELAXED) != GS_CONTROL_MAGIC) return 0;
    return l * 1000;
}

/* A filling Burst claim: until when the GPU's Hard claims have work, as the agent's relay says. 1
 * with *until set; 0 when no relay runs (none seen for GS_RELAY_STALE_NS at now). */
static inline int gs_control_owner_busy(const struct gs_control *c, uint64_t now, uint64_t *until)
{
    uint64_t seen = __atomic_load_n(&c->relay_seen_ns, __ATOMIC_ACQUIRE);
    if (seen == 0 || seen + GS_RELAY_STALE_NS < now || __atomic_load_n(&c->magic, __ATOMIC_RELAXED) != GS_CONTROL_MAGIC)
        return 0;
    *until = __atomic_load_n(&c->owner_busy_until_ns, __ATOMIC_RELAXED);
    return 1;
}

#endif
