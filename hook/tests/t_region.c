/* The region code alone (no CUDA), for ThreadSanitizer and valgrind: threads and processes
 * reserving and releasing on one region never exceed the limit and leave it at 0; a zeroed
 * file is initialised; corrupt and unknown-version regions are refused; a tenant scribbling on
 * the region (used, slots, slots_hw, the lock word) or stopping a lock holder can neither raise
 * the limit nor hang a caller past ~100 ms nor lock the claim out. Prints measured waits.
 * usage: t_region DIR */
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <sys/wait.h>
#include <stdint.h>
#include <unistd.h>

#include "../src/region.h"
#include "testlib.h"

#define LIMIT 1000000ull
static struct gs_region R;
static unsigned long long held, peak;

static void *worker(void *arg)
{
    unsigned long long sz = 1000 + (uintptr_t)arg * 7;
    for (int i = 0; i < 2000; i++) {
        if (gs_region_reserve(&R, sz, LIMIT) == 0) {
            unsigned long long h = __atomic_add_fetch(&held, sz, __ATOMIC_SEQ_CST), p;
            while ((p = __atomic_load_n(&peak, __ATOMIC_SEQ_CST)) < h &&
                   !__atomic_compare_exchange_n(&peak, &p, h, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
            __atomic_sub_fetch(&held, sz, __ATOMIC_SEQ_CST);
            gs_region_release(&R, sz);
        }
    }
    return NULL;
}

static double ms_since(struct timespec t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0.tv_sec) * 1e3 + (t.tv_nsec - t0.tv_nsec) / 1e6;
}

static struct timespec now_ts(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t;
}

/* A child that opens the region, reserves `hold` bytes, says so on the pipe, and then on each
 * byte read reserves 1 more (and gives it back) until the pipe closes. */
static pid_t holder(const char *path, uint64_t hold, int *ctl, int *ready)
{
    int up[2], down[2];
    if (pipe(up) || pipe(down)) exit(2);
    pid_t pid = fork();
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        struct gs_region r;
        char c = gs_region_open(&r, path) == 0 && gs_region_reserve(&r, hold, LIMIT) == 0 ? 'y' : 'n';
        if (write(up[1], &c, 1) != 1) _exit(2);
        while (read(down[0], &c, 1) == 1) {
            c = gs_region_reserve(&r, 1, LIMIT) == 0 ? 'y' : 'n';
            if (c == 'y') gs_region_release(&r, 1);
            if (write(up[1], &c, 1) != 1) _exit(2);
        }
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    *ctl = down[1];
    *ready = up[0];
    return pid;
}

static char ask(int ctl, int ready)
{
    char c = 'x';
    if (write(ctl, &c, 1) != 1 || read(ready, &c, 1) != 1) return 'x';
    return c;
}

static void scribble_tests(const char *path)
{
    struct gs_region_header *h = R.hdr;
    int ctl, ready;
    char c;

    /* `used` written to 0 in a loop while another process holds half: never past the limit */
    pid_t a = holder(path, LIMIT / 2, &ctl, &ready);
    EXPECT(read(ready, &c, 1) == 1 && c == 'y', "holder did not reserve");
    pid_t w = fork();
    if (w == 0) {
        for (;;) __atomic_store_n(&h->used, 0, __ATOMIC_RELAXED);
    }
    while (__atomic_load_n(&h->used, __ATOMIC_RELAXED) != 0) usleep(1000); /* the writer runs */
    unsigned long long got = 0;
    for (int i = 0; i < 200; i++)
        if (gs_region_reserve(&R, LIMIT / 16, LIMIT) == 0) got += LIMIT / 16;
    EXPECT(got == LIMIT / 2, "reserved %llu with used forged to 0, want %llu", got, LIMIT / 2);
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);

    /* another process's live slot forged past the limit counts as the limit, until its owner
     * (on its next reservation) puts it back; slots_hw forged to 0 hides nobody */
    gs_region_release(&R, got);
    int their = -1;
    for (uint32_t i = 0; i < GS_SLOT_COUNT && their < 0; i++)
        if (R.slots[i].in_use && (int)i != R.slot) their = (int)i;
    EXPECT(their >= 0, "no slot for the holder");
    if (their >= 0) {
        R.slots[their].used = UINT64_MAX;
        EXPECT(gs_region_reserve(&R, 1, LIMIT) != 0, "a slot of 2^64-1 counted as less than the limit");
        EXPECT(gs_region_used(&R, LIMIT) == LIMIT, "report %llu", (unsigned long long)gs_region_used(&R, LIMIT));
        EXPECT(ask(ctl, ready) == 'y', "the owner of a forged slot could not reserve"); /* it repairs it */
        EXPECT(R.slots[their].used == LIMIT / 2, "holder's slot not repaired: %llu",
               (unsigned long long)R.slots[their].used);
        h->slots_hw = 0;
        EXPECT(gs_region_reserve(&R, LIMIT / 2 + 1, LIMIT) != 0, "slots_hw=0 hid the holder");
        EXPECT(h->slots_hw > (uint32_t)their, "slots_hw not restored: %u", h->slots_hw);
    }
    /* our own slot forged to 0 does not make room: what we hold is kept privately */
    EXPECT(gs_region_reserve(&R, LIMIT / 4, LIMIT) == 0, "reserve a quarter");
    R.slots[R.slot].used = 0;
    R.slots[R.slot].in_use = 0;
    EXPECT(gs_region_reserve(&R, LIMIT / 4 + 1, LIMIT) != 0, "own forged slot made room");
    EXPECT(R.slots[R.slot].used == LIMIT / 4 && R.slots[R.slot].in_use == 1, "own slot not repaired");
    gs_region_release(&R, LIMIT / 4);
    close(ctl);
    waitpid(a, NULL, 0);
    close(ready);

    /* `used` = 2^64-1: recomputed at the next reservation, nothing locked out */
    h->used = UINT64_MAX;
    EXPECT(gs_region_reserve(&R, LIMIT, LIMIT) == 0, "2^64-1 in used locked the claim out");
    EXPECT(h->used == LIMIT, "used not recomputed: %llu", (unsigned long long)h->used);
    gs_region_release(&R, LIMIT);

    /* a dead process's slot forged to 2^64-1 is reaped */
    R.slots[GS_SLOT_COUNT - 1].in_use = 1;
    R.slots[GS_SLOT_COUNT - 1].used = UINT64_MAX;
    h->slots_hw = GS_SLOT_COUNT;
    EXPECT(gs_region_reserve(&R, LIMIT, LIMIT) == 0, "dead forged slot not reaped");
    gs_region_release(&R, LIMIT);

    /* a forged owner in the mutex word naming our own slot as the holder: repaired after one
     * wait, not a hang (no live process can be inside) */
    __atomic_store_n((uint32_t *)&h->lock.m, 0x3ffffff0u, __ATOMIC_RELAXED);
    h->holder = (uint32_t)R.slot + 1;
    struct timespec t0 = now_ts();
    int rc = gs_region_reserve(&R, 1000, LIMIT);
    double forged_ms = ms_since(t0);
    EXPECT(rc == 0, "forged lock word not repaired");
    EXPECT(forged_ms < 1000, "forged lock word: %.1f ms", forged_ms);
    gs_region_release(&R, 1000);
    t0 = now_ts();
    EXPECT(gs_region_reserve(&R, 1000, LIMIT) == 0, "after repair");
    EXPECT(ms_since(t0) < 50, "still slow after repair: %.1f ms", ms_since(t0));
    gs_region_release(&R, 1000);

    /* a mutex kind glibc will not use (EINVAL at once, whatever the word): repaired, not refused forever */
    h->lock.m.__data.__kind = 0x7f;
    EXPECT(gs_region_reserve(&R, 1000, LIMIT) == 0, "forged mutex kind not repaired");
    gs_region_release(&R, 1000);
    EXPECT(gs_region_reserve(&R, 1000, LIMIT) == 0, "after the kind repair");
    gs_region_release(&R, 1000);

    /* a holder that runs (state R) inside the lock for 400 ms, as one preempted on an overloaded
     * node stands still: waited for (up to GS_LOCK_BUSY_NS), not refused at ~100 ms */
    pid_t spin = fork();
    if (spin == 0) {
        struct gs_region r;
        if (gs_region_open(&r, path) != 0) _exit(1);
        r.fault_spin_ms = 400;
        _exit(gs_region_reserve(&r, 1000, LIMIT) == 0 ? 0 : 1);
    }
    t0 = now_ts();
    while ((__atomic_load_n((uint32_t *)&h->lock.m, __ATOMIC_RELAXED) & 0x3fffffff) != (uint32_t)spin &&
           ms_since(t0) < 5000) {}
    t0 = now_ts();
    rc = gs_region_reserve(&R, 1000, LIMIT);
    double runnable_ms = ms_since(t0);
    EXPECT(rc == 0, "refused while a runnable holder was inside (after %.1f ms)", runnable_ms);
    EXPECT(runnable_ms >= 150 && runnable_ms < 1000, "runnable holder waited for %.1f ms", runnable_ms);
    if (rc == 0) gs_region_release(&R, 1000);
    int spun;
    waitpid(spin, &spun, 0);
    EXPECT(WIFEXITED(spun) && WEXITSTATUS(spun) == 0, "the runnable holder's reservation failed");
    gs_region_reap(&R, 0);

    /* a holder stopped inside the lock: refused within ~100 ms, usage still readable */
    pid_t s = fork();
    if (s == 0) {
        struct gs_region r;
        if (gs_region_open(&r, path) != 0) _exit(1);
        r.fault_stop = 1;
        gs_region_reserve(&r, LIMIT / 2, LIMIT);
        _exit(0);
    }
    int st;
    waitpid(s, &st, WUNTRACED);
    EXPECT(WIFSTOPPED(st), "holder did not stop");
    t0 = now_ts();
    rc = gs_region_reserve(&R, 1000, LIMIT);
    double stopped_ms = ms_since(t0);
    EXPECT(rc != 0, "reserved while a live process holds the lock");
    EXPECT(stopped_ms >= 50 && stopped_ms < 1000, "refusal took %.1f ms", stopped_ms);
    t0 = now_ts();
    uint64_t u = gs_region_used(&R, LIMIT);
    gs_region_reap(&R, 0);
    double query_ms = ms_since(t0);
    EXPECT(u == LIMIT / 2, "usage while wedged %llu", (unsigned long long)u);
    EXPECT(query_ms < 50, "usage query took %.1f ms", query_ms);
    gs_region_release(&R, 1); /* a release never waits either */
    /* kept past GS_LOCK_BREAK_NS as this process sees it: broken, so the claim is not locked out */
    t0 = now_ts();
    while ((rc = gs_region_reserve(&R, 1000, LIMIT)) != 0 && ms_since(t0) < 5000) {}
    double broken_ms = ms_since(t0);
    EXPECT(rc == 0 && broken_ms >= 800, "stopped holder's lock broken after %.0f ms (rc %d)", broken_ms, rc);
    if (rc == 0) gs_region_release(&R, 1000);
    kill(s, SIGKILL);
    waitpid(s, NULL, 0);
    EXPECT(gs_region_reserve(&R, LIMIT, LIMIT) == 0, "dead stopped holder's reservation not reclaimed");
    gs_region_release(&R, LIMIT);
    printf("forged_lock_first_reserve_ms=%.1f stopped_holder_refusal_ms=%.1f wedged_usage_query_ms=%.3f "
           "stopped_holder_broken_ms=%.0f runnable_holder_wait_ms=%.1f\n", forged_ms, stopped_ms, query_ms,
           broken_ms, runnable_ms);
}

static void make_file(const char *path)
{
    FILE *f = fopen(path, "w");
    fclose(f);
    if (truncate(path, GS_REGION_SIZE) != 0) exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2) return 64;
    char path[4096];
    snprintf(path, sizeof path, "%s/region-test", argv[1]);
    make_file(path);
    EXPECT(gs_region_open(&R, path) == 0, "open zeroed region");
    /* whole limit, exactly */
    EXPECT(gs_region_reserve(&R, LIMIT, LIMIT) == 0, "reserve limit");
    EXPECT(gs_region_reserve(&R, 1, LIMIT) != 0, "reserve past limit");
    EXPECT(gs_region_reserve(&R, UINT64_MAX, LIMIT) != 0, "reserve SIZE_MAX");
    gs_region_release(&R, LIMIT);
    EXPECT(gs_region_used(&R, LIMIT) == 0, "used %llu", (unsigned long long)gs_region_used(&R, LIMIT));

    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        if ((kids[k] = fork()) == 0) {
            struct gs_region r2;
            if (gs_region_open(&r2, path) != 0) _exit(1);
            for (int i = 0; i < 3000; i++)
                if (gs_region_reserve(&r2, 5000, LIMIT) == 0) gs_region_release(&r2, 5000);
            _exit(0);
        }
    }
    enum { N = 8 };
    pthread_t th[N];
    for (uintptr_t i = 0; i < N; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (int k = 0; k < 2; k++) {
        int st;
        waitpid(kids[k], &st, 0);
        EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d", k);
    }
    EXPECT(peak <= LIMIT, "peak %llu", peak);
    EXPECT(gs_region_used(&R, LIMIT) == 0, "used after all %llu", (unsigned long long)gs_region_used(&R, LIMIT));

    /* a dead process's reservation is reclaimed */
    pid_t p = fork();
    if (p == 0) {
        struct gs_region r2;
        _exit(gs_region_open(&r2, path) == 0 && gs_region_reserve(&r2, LIMIT, LIMIT) == 0 ? 0 : 1);
    }
    waitpid(p, NULL, 0);
    EXPECT(gs_region_reserve(&R, LIMIT, LIMIT) == 0, "dead process's usage not reclaimed");
    gs_region_release(&R, LIMIT);

    scribble_tests(path);

    /* refused: corrupt magic, unknown version, wrong size */
    struct gs_region bad;
    char p2[4200];
    snprintf(p2, sizeof p2, "%s/region-bad", argv[1]);
    make_file(p2);
    EXPECT(gs_region_open(&bad, p2) == 0, "open");
    struct gs_region_header *h = bad.hdr;
    h->version = 99;
    EXPECT(gs_region_open(&bad, p2) != 0, "unknown version accepted");
    h->magic = 0x1234;
    EXPECT(gs_region_open(&bad, p2) != 0, "corrupt magic accepted");
    if (truncate(p2, 4096) != 0) return 2;
    EXPECT(gs_region_open(&bad, p2) != 0, "short file accepted");
    return t_done("t_region");
}
