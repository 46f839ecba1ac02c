/* Shared usage region: reservation, release and reclamation of dead processes' usage.
 *
 * The region is writable by every tenant process of the claim, so nothing in it is trusted:
 * - the claim's usage is the sum of the live slots, recomputed under the lock by every
 *   reservation (never the `used` field, which is only kept for readers and repaired); our own
 *   slot counts what this process knows it holds (`mine`), whatever the slot says;
 * - a slot can never legitimately hold more than the limit, so more counts as the limit: a
 *   forged slot gives a tenant no more than allocating the limit would;
 * - a lock that does not move is waited for at most GS_LOCK_WAIT_NS. The holder writes its
 *   slot in `holder` and bumps `lock_seq`; a waiter that sees the lock stand still breaks it
 *   at once if no live process can be inside (forged or orphaned word), refuses (OOM) while a
 *   live holder keeps it, and breaks that too once it has seen it kept for GS_LOCK_BREAK_NS
 *   (see break_lock).
 * `used` follows the slots (after them), so legitimately sum of live slots <= used <= limit.
 * Anything else is logged. */
#define _GNU_SOURCE
#include "region.h"
#include "robust_mutex.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "liveness.h"
#include "log.h"
#include "rawstat.h"

uint64_t gs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static long slot_offset(int i) { return (long)GS_HEADER_SIZE + (long)i * GS_SLOT_SIZE; }

#define FUTEX_TID_MASK 0x3fffffff  /* owner tid in a robust mutex's lock word (linux/futex.h) */
#define HOLDER_BYTE 32               /* OFD lock of a process breaking the mutex (no slot's byte) */
#define LOG_EVERY_NS 10000000000ull  /* a tenant rewriting the region in a loop: one line per 10 s */

static void init_region(void *base)
{
    struct gs_region_header *h = base;
    memset(base, 0, GS_REGION_SIZE);
    h->version = GS_REGION_VERSION;
    h->header_size = GS_HEADER_SIZE;
    h->slot_size = GS_SLOT_SIZE;
    h->slot_count = GS_SLOT_COUNT;
    h->region_size = GS_REGION_SIZE;
    gs_robust_mutex_init(&h->lock.m);
    /* magic last: a region is usable only once everything above is in place */
    __atomic_store_n(&h->magic, GS_REGION_MAGIC, __ATOMIC_RELEASE);
}

static int check_header(const struct gs_region_header *h, const char *path)
{
    uint64_t magic = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);
    if (magic != GS_REGION_MAGIC) {
        gs_log("region %s is corrupt (magic %#llx); failing closed for this GPU", path,
               (unsigned long long)magic);
        return -1;
    }
    if (h->version != GS_REGION_VERSION) {
        gs_log("region %s has unknown version %u (this library knows %u); failing closed for this GPU",
               path, h->version, GS_REGION_VERSION);
        return -1;
    }
    if (h->header_size != GS_HEADER_SIZE || h->slot_size != GS_SLOT_SIZE ||
        h->slot_count != GS_SLOT_COUNT || h->region_size != GS_REGION_SIZE) {
        gs_log("region %s is corrupt (layout fields do not match); failing closed for this GPU", path);
        return -1;
    }
    return 0;
}

/* Logs a repair: the first time, then at most once per LOG_EVERY_NS with how many were not. */
__attribute__((format(printf, 3, 4))) static void log_repair(struct gs_region *r, int kind, const char *fmt, ...)
{
    uint64_t now = gs_now_ns();
    uint64_t last = __atomic_load_n(&r->last_log_ns[kind], __ATOMIC_RELAXED);
    if (last && now - last < LOG_EVERY_NS) {
        __atomic_add_fetch(&r->unlogged[kind], 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_store_n(&r->last_log_ns[kind], now, __ATOMIC_RELAXED);
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    uint64_t n = __atomic_exchange_n(&r->unlogged[kind], 0, __ATOMIC_RELAXED);
    char more[64] = "";
    if (n) snprintf(more, sizeof more, " (and %llu more since the last line)", (unsigned long long)n);
    gs_log("region %s: %s%s", r->path[0] ? r->path : "(private)", msg, more);
}

static void init_local(struct gs_region *r)
{
    pthread_mutex_init(&r->local, NULL);
    pthread_mutex_init(&r->pub, NULL);
}

int gs_region_open(struct gs_region *r, const char *path)
{
    memset(r, 0, sizeof *r);
    r->slot = -1;
    r->lock_fd = -1;
    init_local(r);
    if (!path) { /* per-process accounting: same code on a private page set */
        void *p = mmap(NULL, GS_REGION_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            gs_log("cannot map a private region: %s", strerror(errno));
            return -1;
        }
        init_region(p);
        r->hdr = p;
        r->slots = (struct gs_slot *)((char *)p + GS_HEADER_SIZE);
        return 0;
    }
    snprintf(r->path, sizeof r->path, "%s", path);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        gs_log("cannot open region %s: %s; failing closed for this GPU", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (gs_fstat(fd, &st) != 0 || st.st_size != GS_REGION_SIZE) {
        gs_log("region %s has size %lld, expected %u; failing closed for this GPU", path,
               (long long)st.st_size, GS_REGION_SIZE);
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, GS_REGION_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        gs_log("cannot map region %s: %s; failing closed for this GPU", path, strerror(errno));
        close(fd);
        return -1;
    }
    struct gs_region_header *h = p;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == 0) {
        /* created zero-filled by the kubelet plugin: the first user initialises it; nobody
         * uses a region before its magic is set, so (re)initialising under flock is safe */
        flock(fd, LOCK_EX);
        if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == 0) init_region(p);
        flock(fd, LOCK_UN);
    }
    /* the mapping keeps the file; the liveness lock uses a description of its own so that a
     * fork child, which inherits the mapping, does not keep the parent's lock alive */
    close(fd);
    if (check_header(h, path) != 0) {
        munmap(p, GS_REGION_SIZE);
        return -1;
    }
    r->hdr = h;
    r->slots = (struct gs_slot *)((char *)p + GS_HEADER_SIZE);
    return 0;
}

/* slots_hw as this process knows it: never below what it has seen (it never legitimately falls) */
static uint32_t slots_hw(struct gs_region *r)
{
    uint32_t hw = __atomic_load_n(&r->hdr->slots_hw, __ATOMIC_RELAXED);
    if (hw > GS_SLOT_COUNT) hw = GS_SLOT_COUNT; /* the region is tenant-writable */
    uint32_t seen = __atomic_load_n(&r->hw_seen, __ATOMIC_RELAXED);
    while (hw > seen && !__atomic_compare_exchange_n(&r->hw_seen, &seen, hw, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return hw > seen ? hw : seen;
}

static int open_lock_fd(struct gs_region *r)
{
    if (r->lock_fd < 0) r->lock_fd = open(r->path, O_RDWR | O_CLOEXEC);
    return r->lock_fd;
}

static uint64_t add_sat(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

/* What slot i counts for: our own slot is what we know we hold; another live slot at most the
 * limit. Sets *forged when a slot claims more than the limit. Lock-free reads. */
static uint64_t slot_usage(struct gs_region *r, uint32_t i, uint64_t limit, int *forged)
{
    if ((int)i == __atomic_load_n(&r->slot, __ATOMIC_RELAXED)) return __atomic_load_n(&r->mine, __ATOMIC_RELAXED);
    struct gs_slot *s = &r->slots[i];
    if (!__atomic_load_n(&s->in_use, __ATOMIC_RELAXED)) return 0;
    uint64_t u = __atomic_load_n(&s->used, __ATOMIC_RELAXED);
    if (u > limit) {
        *forged = 1;
        return limit;
    }
    return u;
}

static uint64_t slots_sum(struct gs_region *r, uint64_t limit, int *forged)
{
    uint64_t sum = 0;
    uint32_t hw = slots_hw(r);
    for (uint32_t i = 0; i < hw; i++) sum = add_sat(sum, slot_usage(r, i, limit, forged));
    return sum;
}

/* our slot <- mine; callers hold pub */
static void publish_mine(struct gs_region *r)
{
    __atomic_store_n(&r->slots[r->slot].used, r->mine, __ATOMIC_RELAXED);
}

/* Under the lock: put our own slot and slots_hw right, and log what a tenant changed. */
static void repair_own_locked(struct gs_region *r)
{
    uint32_t hw = __atomic_load_n(&r->hdr->slots_hw, __ATOMIC_RELAXED), known = slots_hw(r);
    if (hw < known) {
        log_repair(r, GS_LOG_SLOT, "slots_hw was %u, below slot %u that this process has seen used; restored",
                   hw, known - 1);
        __atomic_store_n(&r->hdr->slots_hw, known, __ATOMIC_RELAXED);
    }
    if (r->slot < 0) return;
    struct gs_slot *s = &r->slots[r->slot];
    pthread_mutex_lock(&r->pub);
    if (s->in_use != 1 || s->used != r->mine) {
        log_repair(r, GS_LOG_SLOT, "slot %d of this process said in_use=%u used=%llu, it holds %llu; restored",
                   r->slot, s->in_use, (unsigned long long)s->used, (unsigned long long)r->mine);
        __atomic_store_n(&s->in_use, 1, __ATOMIC_RELAXED);
        publish_mine(r);
    }
    pthread_mutex_unlock(&r->pub);
}

/* `used` -= u, saturating (atomic: releases do it without the lock) */
static void sub_used(struct gs_region *r, uint64_t u)
{
    uint64_t old = __atomic_load_n(&r->hdr->used, __ATOMIC_RELAXED);
    /* release: whoever sees the lower `used` sees the lower slot too */
    while (u && !__atomic_compare_exchange_n(&r->hdr->used, &old, old - (u < old ? u : old), 1, __ATOMIC_RELEASE,
                                             __ATOMIC_RELAXED)) {}
}

/* Under the lock: the claim's usage from the live slots. `used` moves with them (reservations
 * add after their slot grows, releases subtract after it shrinks), so it can only be in
 * [sum, limit]; outside, a tenant wrote it: logged and rewritten. */
static uint64_t recount_locked(struct gs_region *r, uint64_t limit)
{
    int forged = 0;
    /* `used` first: a release lowers its slot before `used`, so read in this order (acquire)
     * a legitimate `used` is never below the sum */
    uint64_t used = __atomic_load_n(&r->hdr->used, __ATOMIC_ACQUIRE);
    uint64_t sum = slots_sum(r, limit, &forged);
    if (forged)
        log_repair(r, GS_LOG_SLOT, "a live slot claimed more than the limit %llu; counted as the limit",
                   (unsigned long long)limit);
    if (r->resync || used < sum || used > limit) {
        if (!r->resync)
            log_repair(r, GS_LOG_USED, "used was %llu, live slots hold %llu (limit %llu); recomputed",
                       (unsigned long long)used, (unsigned long long)sum, (unsigned long long)limit);
        __atomic_store_n(&r->hdr->used, sum, __ATOMIC_RELAXED);
        r->resync = 0;
    }
    return sum;
}

/* Under the lock: a dead process's slot cleared, its usage with it. */
static void clear_dead_slot(struct gs_region *r, struct gs_slot *s)
{
    sub_used(r, __atomic_load_n(&s->used, __ATOMIC_RELAXED));
    memset(s, 0, sizeof *s);
    r->hdr->reaped++;
}

static void reap_locked(struct gs_region *r)
{
    if (!r->path[0] || open_lock_fd(r) < 0) return; /* private region: nobody else */
    uint32_t hw = slots_hw(r);
    for (uint32_t i = 0; i < hw; i++) {
        struct gs_slot *s = &r->slots[i];
        if (!s->in_use || (int)i == r->slot || gs_live_held(r->lock_fd, slot_offset(i))) continue;
        clear_dead_slot(r, s);
    }
}

static uint64_t proc_start_time(void)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* comm may contain spaces */
    if (!p) return 0;
    for (int field = 2; field < 22 && p; field++) p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* Once per process: every slot in use counts, even past a slots_hw a tenant lowered. */
static void learn_hw(struct gs_region *r)
{
    for (uint32_t i = GS_SLOT_COUNT; i > slots_hw(r); i--)
        if (__atomic_load_n(&r->slots[i - 1].in_use, __ATOMIC_RELAXED)) {
            __atomic_store_n(&r->hw_seen, i, __ATOMIC_RELAXED); /* only under the lock: no lost raise */
            break;
        }
}

static void take_slot(struct gs_region *r, uint32_t i)
{
    struct gs_slot *s = &r->slots[i];
    pthread_mutex_lock(&r->pub);
    __atomic_store_n(&r->mine, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->used, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->in_use, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&r->slot, (int)i, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&r->pub);
    if (i >= slots_hw(r)) __atomic_store_n(&r->hw_seen, i + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&r->hdr->holder, i + 1, __ATOMIC_RELAXED); /* registered inside the lock */
    if (i >= __atomic_load_n(&r->hdr->slots_hw, __ATOMIC_RELAXED))
        __atomic_store_n(&r->hdr->slots_hw, i + 1, __ATOMIC_RELAXED);
}

static int register_locked(struct gs_region *r)
{
    if (!r->path[0]) {
        take_slot(r, 0);
        return 0;
    }
    if (open_lock_fd(r) < 0) return -1;
    learn_hw(r);
    for (uint32_t i = 0; i < GS_SLOT_COUNT; i++) {
        struct gs_slot *s = &r->slots[i];
        /* a dead process's slot is taken over (its usage with it): slots stay packed, so the
         * sums over [0, slots_hw) stay short */
        if (s->in_use && gs_live_held(r->lock_fd, slot_offset(i))) continue;
        if (gs_live_claim(r->lock_fd, slot_offset(i)) != 0) continue;
        if (s->in_use) clear_dead_slot(r, s);
        struct stat st;
        s->pid = getpid();
        s->start_time = proc_start_time();
        s->pidns = gs_stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
        take_slot(r, i);
        return 0;
    }
    gs_log("region %s: no free usage slot", r->path);
    return -1;
}

/* ---- the lock: a robust process-shared mutex in tenant-writable memory, so held with care ---- */

static struct timespec deadline_in(uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* the clock pthread_mutex_timedlock uses */
    uint64_t t = (uint64_t)ts.tv_nsec + ns;
    ts.tv_sec += (time_t)(t / 1000000000ull);
    ts.tv_nsec = (long)(t % 1000000000ull);
    return ts;
}

/* Just locked (rc 0 or EOWNERDEAD): say who is inside, remember the robust-list links. */
static void locked(struct gs_region *r, int rc)
{
    pthread_mutex_t *m = &r->hdr->lock.m;
    if (rc == EOWNERDEAD) { /* the holder died mid-update (slot raised, `used` not yet) */
        reap_locked(r);
        r->resync = 1; /* `used` is rewritten from the slots, without a "forged" line */
        pthread_mutex_consistent(m);
    }
    __atomic_store_n(&r->hdr->holder, (uint32_t)(r->slot + 1), __ATOMIC_RELAXED);
    __atomic_store_n(&r->hdr->lock_seq, r->hdr->lock_seq + 1, __ATOMIC_RELAXED); /* "it moves" */
    /* glibc unlinks a robust mutex from the thread's robust list through these pointers, which
     * sit in the shared page: a tenant rewriting them while we hold the lock would make us write
     * through its pointers. They are put back as glibc set them before unlocking. */
    r->saved_list = m->__data.__list;
    r->saved_kind = m->__data.__kind;
    r->saved_owner = m->__data.__lock & FUTEX_TID_MASK; /* our tid, as glibc wrote it */
}

static void shared_unlock(struct gs_region *r)
{
    pthread_mutex_t *m = &r->hdr->lock.m;
    /* not ours any more (rewritten, or broken by a waiter): leave it to them */
    if ((__atomic_load_n(&m->__data.__lock, __ATOMIC_RELAXED) & FUTEX_TID_MASK) == r->saved_owner) {
        __atomic_store_n(&r->hdr->holder, 0, __ATOMIC_RELAXED);
        m->__data.__list = r->saved_list;
        m->__data.__kind = r->saved_kind;
        pthread_mutex_unlock(m);
    }
}

static struct gs_lock_view lock_view(struct gs_region *r)
{
    /* the owner only: waiters set FUTEX_WAITERS in the word themselves */
    struct gs_lock_view v = {__atomic_load_n((uint32_t *)&r->hdr->lock.m.__data.__lock, __ATOMIC_RELAXED) & FUTEX_TID_MASK,
                          __atomic_load_n(&r->hdr->holder, __ATOMIC_RELAXED),
                          __atomic_load_n(&r->hdr->lock_seq, __ATOMIC_RELAXED)};
    return v;
}

static int same_view(struct gs_lock_view a, struct gs_lock_view b)
{
    return a.word == b.word && a.holder == b.holder && a.seq == b.seq;
}

/* The lock has not moved for GS_STUCK_NS, or glibc refuses to use it (`unusable`: a forged
 * kind, not recoverable). Break it (reinitialise and take it) when it is unusable or nobody live
 * can be inside: `holder` names no slot, a dead one, or ours (we are not inside: our threads
 * queue on `local`); or when the same live holder has kept it without moving for
 * GS_LOCK_BREAK_NS as this process saw it (a stopped process, or forged fields). Otherwise -1:
 * a live holder is inside. Breakers exclude each other with an OFD lock on HOLDER_BYTE. */
static int break_lock(struct gs_region *r, struct gs_lock_view v, int unusable)
{
    if (!r->path[0] || open_lock_fd(r) < 0 || (v.word == 0 && !unusable)) return -1; /* free now: wait on */
    int live = !unusable && v.holder > 0 && v.holder <= GS_SLOT_COUNT && (int)v.holder - 1 != r->slot &&
               gs_live_held(r->lock_fd, slot_offset(v.holder - 1));
    uint64_t now = gs_now_ns();
    if (live && !same_view(v, r->stuck)) {
        r->stuck = v, r->stuck_since = now;
        return -1;
    }
    if (live && now - r->stuck_since < GS_LOCK_BREAK_NS) return -1;
    if (gs_live_claim(r->lock_fd, HOLDER_BYTE) != 0) return -1; /* another process is breaking it */
    int rc = -1;
    if (same_view(lock_view(r), v)) { /* else it moved meanwhile */
        if (live)
            log_repair(r, GS_LOG_LOCK, "lock kept by live slot %u for over %llu ms (stopped?); broken",
                       v.holder - 1, GS_LOCK_BREAK_NS / 1000000);
        else
            log_repair(r, GS_LOG_LOCK, "lock word %#x, holder %u: %s; reinitialised", v.word, v.holder,
                       unusable ? "glibc cannot use the mutex (forged)"
                                : "no live process inside (forged, or its holder died unnoticed)");
        gs_robust_mutex_init(&r->hdr->lock.m);
        rc = pthread_mutex_trylock(&r->hdr->lock.m);
    }
    struct flock fl = gs_byte_lock(HOLDER_BYTE);
    fl.l_type = F_UNLCK;
    fcntl(r->lock_fd, F_OFD_SETLK, &fl);
    if (rc != 0) return -1;
    memset(&r->stuck, 0, sizeof r->stuck);
    return 0;
}

/* The state (proc(5): R running or runnable, S, D, T stopped...) of the thread the lock word
 * names, as this process can see it: only where the slot `holder` names is of our pid namespace
 * ('?' otherwise; the word's tid is its holder's, `holder` can lag the word by a moment). A
 * runnable holder (R: on a CPU, or preempted and waiting for one) is waited for as contention is:
 * on an overloaded node a holder preempted inside the lock stands still for as long as the
 * scheduler keeps it off a CPU, 80-300 ms measured with 8 processes racing for one region beside
 * busy loops (2 cores and 28 loops, or 1 core and 12), where waiters were refused in 7 of 12 runs
 * (hook/README.md). A stopped holder (T) or one this process cannot see is what the 100 ms
 * refusal is for. Everything read is the tenant's (the slot, the word): a forgery makes a waiter
 * wait as contention does (GS_LOCK_BUSY_NS), and break_lock's GS_LOCK_BREAK_NS still applies. */
static char holder_state(struct gs_region *r, struct gs_lock_view v)
{
    static uint64_t pidns; /* ours, read once (threads may race to read it: same value) */
    uint64_t own_pidns = __atomic_load_n(&pidns, __ATOMIC_RELAXED);
    struct stat st;
    if (!own_pidns && gs_stat("/proc/self/ns/pid", &st) == 0)
        __atomic_store_n(&pidns, own_pidns = st.st_ino, __ATOMIC_RELAXED);
    if (!own_pidns || v.word == 0 || v.holder == 0 || v.holder > GS_SLOT_COUNT) return '?';
    if (__atomic_load_n(&r->slots[v.holder - 1].pidns, __ATOMIC_RELAXED) != own_pidns) return '?';
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", v.word); /* a thread's too, leader or not */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return '?';
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return '?';
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
    return p && p[1] == ' ' && p[2] ? p[2] : '?';
}

/* Wait for the shared mutex in slices, watching it move. A lock that does not move for
 * GS_STUCK_NS is broken if nobody live is inside (break_lock), else refused at GS_LOCK_WAIT_NS
 * unless its holder is seen runnable (holder_state R: preempted, not stopped); a lock that
 * keeps moving (contention), or whose holder is runnable, is waited for up to GS_LOCK_BUSY_NS. */
static int wait_shared(struct gs_region *r)
{
    uint64_t start = gs_now_ns(), moved = start, now = start;
    uint64_t refuse = start + GS_LOCK_WAIT_NS - GS_LOCK_SLACK_NS; /* wake-ups come late, never early */
    struct gs_lock_view v = lock_view(r);
    r->holder_state = '-';
    for (;;) {
        /* look again after a slice, or when the lock would count as stuck, or be refused */
        uint64_t next = now + GS_LOCK_SLICE_NS;
        if (moved + GS_STUCK_NS > now && moved + GS_STUCK_NS < next) next = moved + GS_STUCK_NS;
        if (refuse > now && refuse < next) next = refuse;
        struct timespec dl = deadline_in(next - now);
        int rc = pthread_mutex_timedlock(&r->hdr->lock.m, &dl);
        if (rc == 0 || rc == EOWNERDEAD) return rc;
        now = gs_now_ns();
        struct gs_lock_view w = lock_view(r);
        if (!same_view(w, v)) v = w, moved = now;
        /* not a timeout: a lock word glibc will not wait on (forged kind, not recoverable) */
        if ((rc != ETIMEDOUT || now - moved >= GS_STUCK_NS) && break_lock(r, v, rc != ETIMEDOUT) == 0) return 0;
        if (rc != ETIMEDOUT || now - start >= GS_LOCK_BUSY_NS ||
            (now >= refuse && now - moved >= GS_STUCK_NS && (r->holder_state = holder_state(r, v)) != 'R')) {
            r->waited_ns = now - start, r->unmoved_ns = now - moved;
            return rc;
        }
    }
}

/* 0 = locked; -1 = refused (logged). blocking=0: try once. */
static int region_lock(struct gs_region *r, int blocking)
{
    if (!blocking) {
        if (pthread_mutex_trylock(&r->local) != 0) return -1;
        int rc = pthread_mutex_trylock(&r->hdr->lock.m);
        if (rc == 0 || rc == EOWNERDEAD) {
            locked(r, rc);
            return 0;
        }
        pthread_mutex_unlock(&r->local);
        return -1;
    }
    int rc = pthread_mutex_trylock(&r->local); /* uncontended: no clock is read */
    if (rc == EBUSY) {
        struct timespec dl = deadline_in(GS_LOCK_BUSY_NS);
        rc = pthread_mutex_timedlock(&r->local, &dl);
    }
    if (rc != 0) return -1; /* another thread of ours has been waiting for the shared lock */
    rc = pthread_mutex_trylock(&r->hdr->lock.m);
    if (rc == EBUSY) rc = wait_shared(r);
    else if (rc != 0 && rc != EOWNERDEAD && break_lock(r, lock_view(r), 1) == 0) rc = 0;
    if (rc == 0 || rc == EOWNERDEAD) {
        locked(r, rc);
        return 0;
    }
    if (rc == ETIMEDOUT)
        log_repair(r, GS_LOG_WEDGED, "lock kept by a live process (error %d after waiting %llu ms, unmoved for the "
                   "last %llu ms, holder state %c); allocation refused", rc, (unsigned long long)(r->waited_ns / 1000000),
                   (unsigned long long)(r->unmoved_ns / 1000000), r->holder_state);
    else
        log_repair(r, GS_LOG_WEDGED, "lock kept by a live process (error %d after one try); allocation refused", rc);
    pthread_mutex_unlock(&r->local);
    return -1;
}

static void region_unlock(struct gs_region *r)
{
    shared_unlock(r);
    pthread_mutex_unlock(&r->local);
}

static int fits(uint64_t used, uint64_t size, uint64_t limit)
{
    return used <= limit && size <= limit - used; /* no overflow for any size */
}

int gs_region_reserve(struct gs_region *r, uint64_t size, uint64_t limit)
{
    if (region_lock(r, 1) != 0) {
        __atomic_add_fetch(&r->hdr->oom_refusals, 1, __ATOMIC_RELAXED);
        return -1;
    }
    int rc = -1;
    if (r->slot < 0 && register_locked(r) != 0) goto out;
    repair_own_locked(r);
    uint64_t sum = recount_locked(r, limit);
    if (!fits(sum, size, limit)) { /* maybe dead processes hold it */
        reap_locked(r);
        int forged = 0;
        sum = slots_sum(r, limit, &forged);
    }
    if (fits(sum, size, limit)) {
        pthread_mutex_lock(&r->pub);
        __atomic_store_n(&r->mine, r->mine + size, __ATOMIC_RELAXED);
        publish_mine(r);
        pthread_mutex_unlock(&r->pub);
#ifdef GS_TEST_FAULTS
        if (r->fault_stop) raise(SIGSTOP); /* test builds only: stop here, holding the lock */
        for (uint64_t t0 = gs_now_ns(); r->fault_spin_ms && gs_now_ns() - t0 < r->fault_spin_ms * 1000000ull;) {}
#endif
        __atomic_add_fetch(&r->hdr->used, size, __ATOMIC_RELAXED);
        rc = 0;
    } else {
        __atomic_add_fetch(&r->hdr->oom_refusals, 1, __ATOMIC_RELAXED);
    }
out:
    region_unlock(r);
    return rc;
}

void gs_region_release(struct gs_region *r, uint64_t size)
{
    if (size == 0 || r->slot < 0) return;
    pthread_mutex_lock(&r->pub);
    uint64_t u = size < r->mine ? size : r->mine;
    __atomic_store_n(&r->mine, r->mine - u, __ATOMIC_RELAXED);
    publish_mine(r);
    pthread_mutex_unlock(&r->pub);
    sub_used(r, u); /* after the slot, so that `used` never falls below the slots' sum */
}

uint64_t gs_region_used(struct gs_region *r, uint64_t limit)
{
    int forged = 0;
    return slots_sum(r, limit, &forged);
}

void gs_region_reap(struct gs_region *r, uint64_t min_interval_ns)
{
    uint64_t now = gs_now_ns();
    if (now - __atomic_load_n(&r->last_reap_ns, __ATOMIC_RELAXED) < min_interval_ns) return;
    __atomic_store_n(&r->last_reap_ns, now, __ATOMIC_RELAXED);
    if (region_lock(r, 0) != 0) return;
    reap_locked(r);
    region_unlock(r);
}

void gs_region_forget_slot(struct gs_region *r)
{
    if (!r->hdr) return;
    init_local(r); /* a thread of the parent may have held them at fork */
    r->mine = 0;
    memset(&r->stuck, 0, sizeof r->stuck);
    if (!r->path[0]) { /* private copy: the child owns none of the parent's memory */
        init_region(r->hdr);
        r->slot = -1;
        r->hw_seen = 0;
        return;
    }
    if (r->lock_fd >= 0) close(r->lock_fd); /* the parent's description keeps its lock */
    r->lock_fd = -1;
    r->slot = -1;
}
