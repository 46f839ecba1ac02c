/* The region code alone (no CUDA), for ThreadSanitizer and valgrind: threads and processes
 * reserving and releasing on one region never exceed the limit and leave it at 0; a zeroed
 * file is initialised; corrupt and unknown-version regions are refused.
 * usage: t_region DIR */
#include <pthread.h>
#include <sys/wait.h>
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
    EXPECT(gs_region_used(&R) == 0, "used %llu", (unsigned long long)gs_region_used(&R));

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
    EXPECT(gs_region_used(&R) == 0, "used after all %llu", (unsigned long long)gs_region_used(&R));

    /* a dead process's reservation is reclaimed */
    pid_t p = fork();
    if (p == 0) {
        struct gs_region r2;
        _exit(gs_region_open(&r2, path) == 0 && gs_region_reserve(&r2, LIMIT, LIMIT) == 0 ? 0 : 1);
    }
    waitpid(p, NULL, 0);
    EXPECT(gs_region_reserve(&R, LIMIT, LIMIT) == 0, "dead process's usage not reclaimed");
    gs_region_release(&R, LIMIT);

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
