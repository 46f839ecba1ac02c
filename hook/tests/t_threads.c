/* 32 threads allocate and free at once: the claim never holds more than its limit and
 * every byte comes back. usage: t_threads LIMIT CHUNK ROUNDS */
#include <pthread.h>

#include "testlib.h"

static unsigned long long L, C;
static int R;
static unsigned long long held, peak; /* what the threads hold, by their own count */
static pthread_barrier_t start;

static void *worker(void *arg)
{
    (void)arg;
    CUdevice d;
    CUcontext c;
    cuDeviceGet(&d, 0);
    cuDevicePrimaryCtxRetain(&c, d);
    cuCtxSetCurrent(c);
    CUdeviceptr ptrs[256];
    pthread_barrier_wait(&start);
    for (int r = 0; r < R; r++) {
        int n = 0;
        while (n < 256 && cuMemAlloc_v2(&ptrs[n], C) == CUDA_SUCCESS) {
            unsigned long long h = __atomic_add_fetch(&held, C, __ATOMIC_SEQ_CST), p;
            while ((p = __atomic_load_n(&peak, __ATOMIC_SEQ_CST)) < h &&
                   !__atomic_compare_exchange_n(&peak, &p, h, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
            n++;
        }
        while (n > 0) {
            __atomic_sub_fetch(&held, C, __ATOMIC_SEQ_CST);
            if (cuMemFree_v2(ptrs[--n]) != CUDA_SUCCESS) __atomic_add_fetch(&t_failures, 1, __ATOMIC_SEQ_CST);
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4) return 64;
    L = strtoull(argv[1], NULL, 10);
    C = strtoull(argv[2], NULL, 10);
    R = atoi(argv[3]);
    t_setup(0);
    enum { N = 32 };
    pthread_t th[N];
    pthread_barrier_init(&start, NULL, N);
    for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, worker, NULL);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    EXPECT(peak <= L, "threads held %llu > limit %llu", peak, L);
    EXPECT(peak >= L - C * N, "peak %llu suspiciously low", peak);
    EXPECT(t_used() == 0, "used after all frees %llu", t_used());
    printf("peak=%llu\n", peak);
    return t_done("t_threads");
}
