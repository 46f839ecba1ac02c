/* A tenant whose threads keep replacing each other (issue 40): the main thread starts a
 * thread and calls pthread_exit (a zombie leader); that thread allocates BYTES of device
 * memory through libcuda.so.1 and prints `allocated=BYTES at_ns=T` (T: CLOCK_MONOTONIC, the
 * host's clock: the agent's time.monotonic()); from then on each thread starts the next one
 * and exits, so no thread of the process lives longer than a thread start, for HOLD seconds;
 * then `survived`. With `plain` the allocating thread just holds the memory (no relay).
 * Built by tests/agent/test_backstop_bound.py.
 *
 *   relay_threads BYTES HOLD [plain]
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int (*cu_fn)();

static unsigned long long bytes;
static double hold_s;
static int plain;
static struct timespec allocated_at;

static double since(const struct timespec *t) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) / 1e9;
}

static void *relay(void *unused) {
    (void)unused;
    if (since(&allocated_at) > hold_s) {
        printf("survived\n");
        fflush(stdout);
        _exit(0);
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t next;
    while (pthread_create(&next, &attr, relay, NULL) != 0)
        ;  /* (the previous thread not yet gone: try again) */
    return NULL;
}

static cu_fn get(void *h, const char *name) {
    cu_fn f = (cu_fn)dlsym(h, name);
    if (!f) {
        fprintf(stderr, "no %s\n", name);
        _exit(70);
    }
    return f;
}

static void *first(void *unused) {
    (void)unused;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        _exit(70);
    }
    int dev = 0;
    void *ctx = NULL;
    uint64_t ptr = 0;
    if (get(h, "cuInit")(0) || get(h, "cuDeviceGet")(&dev, 0) || get(h, "cuDevicePrimaryCtxRetain")(&ctx, dev) ||
        get(h, "cuCtxSetCurrent")(ctx)) {
        fprintf(stderr, "no context\n");
        _exit(70);
    }
    int rc = get(h, "cuMemAlloc_v2")(&ptr, (size_t)bytes);
    if (rc) {
        printf("refused=%d\n", rc);
        fflush(stdout);
        _exit(3);
    }
    clock_gettime(CLOCK_MONOTONIC, &allocated_at);
    printf("allocated=%llu at_ns=%lld\n", bytes,
           (long long)allocated_at.tv_sec * 1000000000LL + allocated_at.tv_nsec);
    fflush(stdout);
    if (plain) {
        while (since(&allocated_at) < hold_s)
            usleep(10000);
    }
    return relay(NULL);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: relay_threads BYTES HOLD [plain]\n");
        return 2;
    }
    bytes = strtoull(argv[1], NULL, 0);
    hold_s = atof(argv[2]);
    plain = argc > 3;
    pthread_t t;
    if (pthread_create(&t, NULL, first, NULL) != 0)
        return 70;
    pthread_exit(NULL);
}
