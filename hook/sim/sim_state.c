#define _GNU_SOURCE
#include "sim_state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../src/liveness.h"
#include "../src/rawstat.h"
#include "sim_mps.h"

struct sim_state *sim;
struct sim_proc *sim_me;
uint64_t sim_kernel_ns = 100000;
uint64_t sim_launch_ns = 3200; /* the H100's ~3.2 us per launch (docs/compute.md) */
char sim_uuid_prefix[64] = "GPU-5ea1c0de-0000-4000-8000-";

static int g_lock_fd = -1;
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_atfork;

#define STATE_SIZE (((sizeof(struct sim_state) + 65535) / 65536) * 65536)

uint64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void sim_sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

static uint64_t parse_size(const char *s, uint64_t dflt)
{
    if (!s || !*s) return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    static const char *suf[] = {"Ki", "Mi", "Gi", "Ti"};
    for (int i = 0; i < 4; i++)
        if (strcmp(end, suf[i]) == 0) return v << (10 * (i + 1));
    return *end ? dflt : v;
}

static long proc_offset(int i) { return (long)((char *)&sim->proc[i] - (char *)sim); }

/* under sim->lock: give back what dead processes held */
static void reap_locked(void)
{
    for (int i = 0; i < SIM_MAX_PROC; i++) {
        struct sim_proc *p = &sim->proc[i];
        if (!p->in_use || p == sim_me || gs_live_held(g_lock_fd, proc_offset(i))) continue;
        for (int d = 0; d < SIM_MAX_DEV; d++) {
            __atomic_sub_fetch(&sim->dev[d].used, p->used[d], __ATOMIC_RELAXED);
            if (p->mig_slot1 && p->used[d]) __atomic_sub_fetch(&sim->mig[d].gi[p->mig_slot1 - 1].used, p->used[d], __ATOMIC_RELAXED);
        }
        memset(p, 0, sizeof *p);
    }
}

void sim_robust_lock(pthread_mutex_t *m)
{
    if (pthread_mutex_lock(m) == EOWNERDEAD) pthread_mutex_consistent(m);
}

static void lock_state(void) { sim_robust_lock(&sim->lock.m); }

/* What dead processes held goes back at once, as the real driver frees a process's memory when
 * it exits: NVML's answers must not count a killed tenant (reaping only at the next process's
 * start left a killed process's memory in the GPU's used total meanwhile). */
void sim_reap(void)
{
    lock_state();
    reap_locked();
    pthread_mutex_unlock(&sim->lock.m);
}

static void after_fork_child(void)
{
    pthread_mutex_init(&g_open_lock, NULL);
    if (g_lock_fd >= 0) close(g_lock_fd);
    g_lock_fd = -1;
    sim_me = NULL; /* the child registers itself on its next sim_open() */
}

/* empty: the file was just created (ftruncate: zeros), so pages nobody uses stay untouched */
static void init_state(void *p, int empty)
{
    struct sim_state *s = p;
    if (!empty) memset(p, 0, STATE_SIZE);
    uint64_t n = parse_size(getenv("GPUSHARE_SIM_DEVICES"), 1);
    s->ndev = n < 1 ? 1 : n > SIM_MAX_DEV ? SIM_MAX_DEV : (uint32_t)n;
    uint64_t mem = parse_size(getenv("GPUSHARE_SIM_MEMORY"), 16ull << 30);
    /* calibrated to the H100 (docs/compute.md): slices of 2.6 ms and a 0.3 ms switch give two
     * busy contexts 89.7 % of solo together, a 2.65 ms kernel beside a busy context 5.55 ms by
     * its event pair (the H100: 5.16), and a client of 0.41 ms requests 2.4 ms apart a p99 of
     * about 2.7 ms (the H100: 2.91); one slice end in four makes a preempted kernel wait a
     * second slice: p90 8.15 ms (the H100: 7.7) */
    s->slice_ns = parse_size(getenv("GPUSHARE_SIM_SLICE_US"), 2600) * 1000;
    s->switch_ns = parse_size(getenv("GPUSHARE_SIM_SWITCH_US"), 300) * 1000;
    uint64_t again = parse_size(getenv("GPUSHARE_SIM_WAIT_AGAIN_PCT"), 25);
    s->again_ppm = (uint32_t)(again > 100 ? 100 : again) * 10000u;
    s->sample_ns = parse_size(getenv("GPUSHARE_SIM_NVML_SAMPLE_MS"), 200) * 1000000;
    if (s->slice_ns == 0) s->slice_ns = 1000;
    if (s->sample_ns == 0) s->sample_ns = 1000000;
    for (uint32_t d = 0; d < s->ndev; d++) {
        s->dev[d].total = mem;
        sim_sched_init(&s->dev[d].sched);
    }
    gs_robust_mutex_init(&s->lock.m);
    sim_mig_init(s->mig);
    __atomic_store_n(&s->magic, SIM_MAGIC, __ATOMIC_RELEASE);
}

/* The state file every simulated process shares (docs/interfaces.md). */
static const char *state_path(void)
{
    const char *path = getenv("GPUSHARE_SIM_STATE");
    return path && *path ? path : "/dev/shm/gpushare-sim.state";
}

static int map_state(void)
{
    const char *path = state_path();
    mode_t old = umask(0);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    umask(old);
    if (fd < 0) {
        fprintf(stderr, "gpushare-sim: cannot open state %s: %s\n", path, strerror(errno));
        return -1;
    }
    flock(fd, LOCK_EX);
    struct stat st;
    int fresh = gs_fstat(fd, &st) == 0 && st.st_size < (off_t)STATE_SIZE;
    int empty = fresh && st.st_size == 0;
    if (fresh && ftruncate(fd, STATE_SIZE) != 0) {
        flock(fd, LOCK_UN);
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, STATE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED && __atomic_load_n(&((struct sim_state *)p)->magic, __ATOMIC_ACQUIRE) != SIM_MAGIC)
        init_state(p, empty);
    flock(fd, LOCK_UN);
    if (p == MAP_FAILED) {
        close(fd);
        return -1;
    }
    g_lock_fd = fd; /* O_CLOEXEC; holds this process's liveness lock */
    sim = p;
    return 0;
}

uint64_t sim_pidns(void)
{
    struct stat st;
    return gs_stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

int sim_open(void)
{
    if (__atomic_load_n(&sim_me, __ATOMIC_ACQUIRE)) return 0;
    pthread_mutex_lock(&g_open_lock);
    int rc = 0;
    if (!sim_me) {
        const char *k = getenv("GPUSHARE_SIM_KERNEL_US");
        if (k && *k) sim_kernel_ns = strtoull(k, NULL, 10) * 1000;
        const char *l = getenv("GPUSHARE_SIM_LAUNCH_NS");
        if (l && *l) sim_launch_ns = strtoull(l, NULL, 10);
        const char *pre = getenv("GPUSHARE_SIM_UUID_PREFIX");
        if (pre && *pre) snprintf(sim_uuid_prefix, sizeof sim_uuid_prefix, "%s", pre);
        if (!g_atfork) {
            pthread_atfork(NULL, NULL, after_fork_child);
            g_atfork = 1;
        }
        if (!sim) rc = map_state();
        else if (g_lock_fd < 0) { /* fork child: own description, own liveness lock */
            g_lock_fd = open(state_path(), O_RDWR | O_CLOEXEC);
            rc = g_lock_fd < 0 ? -1 : 0;
        }
        if (rc == 0) {
            struct sim_mps_client mps = sim_mps_connect();
            lock_state();
            reap_locked();
            struct sim_proc *me = NULL;
            for (int i = 0; i < SIM_MAX_PROC && !me; i++)
                if (!sim->proc[i].in_use && gs_live_claim(g_lock_fd, proc_offset(i)) == 0) me = &sim->proc[i];
            if (me) {
                uint32_t idx = (uint32_t)(me - sim->proc);
                if (idx >= __atomic_load_n(&sim->proc_hw, __ATOMIC_RELAXED))
                    __atomic_store_n(&sim->proc_hw, idx + 1, __ATOMIC_RELAXED);
                memset(me, 0, sizeof *me);
                me->in_use = 1;
                me->pid = getpid();
                me->pidns = sim_pidns();
                me->start_ns = sim_now_ns();
                me->mps_server = mps.server;
                me->mps_threads_ppm = mps.threads_pct * (SIM_FULL / 100);
            }
            pthread_mutex_unlock(&sim->lock.m);
            if (me) __atomic_store_n(&sim_me, me, __ATOMIC_RELEASE);
            else rc = -1;
        }
    }
    pthread_mutex_unlock(&g_open_lock);
    return rc;
}

void sim_uuid_string(int dev, char *out, unsigned len)
{
    snprintf(out, len, "%s%012x", sim_uuid_prefix, dev);
}

void sim_uuid_bytes(int dev, unsigned char out[16])
{
    char s[96];
    sim_uuid_string(dev, s, sizeof s);
    sim_uuid_parse(s, out);
}

void sim_uuid_parse(const char *s, unsigned char out[16])
{
    memset(out, 0, 16);
    int n = 0;
    const char *p = strncmp(s, "GPU-", 4) == 0 || strncmp(s, "MIG-", 4) == 0 ? s + 4 : s;
    for (; *p && n < 32; p++) {
        int v;
        if (*p >= '0' && *p <= '9') v = *p - '0';
        else if (*p >= 'a' && *p <= 'f') v = *p - 'a' + 10;
        else if (*p >= 'A' && *p <= 'F') v = *p - 'A' + 10;
        else continue;
        out[n / 2] |= (unsigned char)(n % 2 ? v : v << 4);
        n++;
    }
}

/* The compute mode decides, as on a real GPU: DEFAULT, any process; PROHIBITED, none;
 * EXCLUSIVE_PROCESS, one process, or the clients of one MPS server (whose server holds the one
 * context). A context is held until the process exits. */
int sim_ctx_claim(int dev)
{
    uint32_t bit = 1u << dev;
    if (__atomic_load_n(&sim_me->ctx_devs, __ATOMIC_RELAXED) & bit) return 0;
    lock_state();
    reap_locked();
    uint32_t mode = sim->dev[dev].compute_mode;
    int ok = mode != SIM_COMPUTEMODE_PROHIBITED;
    for (int i = 0; ok && mode == SIM_COMPUTEMODE_EXCLUSIVE_PROCESS && i < SIM_MAX_PROC; i++) {
        struct sim_proc *p = &sim->proc[i];
        if (p == sim_me || !p->in_use || !(p->ctx_devs & bit)) continue;
        ok = sim_me->mps_server && p->mps_server == sim_me->mps_server;
    }
    if (ok) __atomic_or_fetch(&sim_me->ctx_devs, bit, __ATOMIC_RELAXED);
    int mdev, slot; /* a context in a MIG device is its instance's from the start (NVML lists it there) */
    if (ok && sim_mig_visible(&mdev, &slot) == 0 && mdev == dev)
        __atomic_store_n(&sim_me->mig_slot1, (uint32_t)slot + 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&sim->lock.m);
    return ok ? 0 : -1;
}

/* A process in a MIG device has the instance's memory: booked there first (sim_mig.h) */
static int mig_reserve(int dev, uint64_t size)
{
    int mdev, slot;
    if (sim_mig_visible(&mdev, &slot) != 0 || mdev != dev) return 0;
    struct sim_mig_gi *gi = &sim->mig[dev].gi[slot];
    const struct sim_mig_profile *p = sim_mig_profile_of(dev, gi);
    uint64_t total = p ? p->memory_mib << 20 : 0;
    uint64_t old = __atomic_load_n(&gi->used, __ATOMIC_RELAXED);
    do {
        if (old > total || size > total - old) return -1;
    } while (!__atomic_compare_exchange_n(&gi->used, &old, old + size, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    __atomic_store_n(&sim_me->mig_slot1, (uint32_t)slot + 1, __ATOMIC_RELAXED);
    return 1;
}

static void mig_unreserve(int dev, uint64_t size)
{
    uint32_t slot1 = __atomic_load_n(&sim_me->mig_slot1, __ATOMIC_RELAXED);
    if (slot1) __atomic_sub_fetch(&sim->mig[dev].gi[slot1 - 1].used, size, __ATOMIC_RELAXED);
}

int sim_mem_reserve(int dev, uint64_t size)
{
    int in_mig = mig_reserve(dev, size);
    if (in_mig < 0) return -1;
    struct sim_dev *d = &sim->dev[dev];
    uint64_t old = __atomic_load_n(&d->used, __ATOMIC_RELAXED);
    do {
        if (old > d->total || size > d->total - old) {
            if (in_mig) mig_unreserve(dev, size);
            return -1;
        }
    } while (!__atomic_compare_exchange_n(&d->used, &old, old + size, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    __atomic_add_fetch(&sim_me->used[dev], size, __ATOMIC_RELAXED);
    return 0;
}

void sim_mem_unreserve(int dev, uint64_t size)
{
    mig_unreserve(dev, size);
    __atomic_sub_fetch(&sim->dev[dev].used, size, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&sim_me->used[dev], size, __ATOMIC_RELAXED);
}

extern char **environ;
#define VISIBLE_PREFIX "GPUSHARE_SIM_VISIBLE_"

static uint32_t visible_mask(void)
{
    static uint32_t mask; /* bit per physical GPU; set once, the environment is the process's */
    static int done;
    if (__atomic_load_n(&done, __ATOMIC_ACQUIRE)) return mask;
    uint32_t m = 0;
    int named = 0;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, VISIBLE_PREFIX, sizeof VISIBLE_PREFIX - 1) != 0) continue;
        const char *v = strchr(*e, '=');
        if (!v) continue;
        named = 1;
        for (char *end; *++v;) {
            long i = strtol(v, &end, 10);
            if (end != v && i >= 0 && i < SIM_MAX_DEV) m |= 1u << i;
            v = end;
            if (*v != ',') break;
        }
    }
    unsigned n = sim ? sim->ndev : SIM_MAX_DEV;
    mask = named ? m & ((1u << n) - 1) : (1u << n) - 1;
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    return mask;
}

unsigned sim_visible_count(void) { return (unsigned)__builtin_popcount(visible_mask()); }

int sim_visible_physical(int ordinal)
{
    uint32_t m = visible_mask();
    for (int p = 0; ordinal >= 0 && p < SIM_MAX_DEV; p++)
        if (m & (1u << p) && ordinal-- == 0) return p;
    return -1;
}

int sim_visible_ordinal(int physical)
{
    uint32_t m = visible_mask();
    if (physical < 0 || physical >= SIM_MAX_DEV || !(m & (1u << physical))) return -1;
    return __builtin_popcount(m & ((1u << physical) - 1));
}
