/* N processes race for one claim's memory, ROUNDS times. Each allocates CHUNK until out of
 * memory and holds it until all have reported: together they never exceed the limit, and
 * they get all of it. Then they exit without freeing: the next round only gets the memory
 * back if dead processes' usage is reclaimed. usage: t_race N ROUNDS LIMIT CHUNK */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"

int main(int argc, char **argv)
{
    if (argc < 5) return 64;
    int n = atoi(argv[1]), rounds = atoi(argv[2]);
    unsigned long long L = strtoull(argv[3], NULL, 10), C = strtoull(argv[4], NULL, 10);
    for (int r = 0; r < rounds; r++) {
        int go[2], done[2], results[2];
        if (pipe(go) || pipe(done) || pipe(results)) return 2;
        pid_t pids[256];
        for (int i = 0; i < n; i++) {
            if ((pids[i] = fork()) == 0) {
                char b;
                close(go[1]);
                close(done[1]);
                t_setup(0); /* each child is a fresh CUDA process */
                if (read(go[0], &b, 1) < 0) _exit(3);
                unsigned long long got = 0;
                CUdeviceptr p;
                CUresult rc;
                while ((rc = cuMemAlloc_v2(&p, C)) == CUDA_SUCCESS) got += C;
                if (rc != CUDA_ERROR_OUT_OF_MEMORY) got |= 1ull << 63;
                if (write(results[1], &got, sizeof got) != sizeof got) _exit(3);
                if (read(done[0], &b, 1) < 0) _exit(3); /* hold until everyone reported */
                _exit(0);
            }
        }
        close(go[0]);
        close(done[0]);
        close(results[1]);
        close(go[1]); /* start */
        unsigned long long sum = 0, got;
        for (int i = 0; i < n; i++) {
            if (read(results[0], &got, sizeof got) != sizeof got) {
                EXPECT(0, "round %d: a child did not report", r);
                break;
            }
            EXPECT(!(got >> 63), "round %d: a child saw an error other than OOM", r);
            sum += got & ~(1ull << 63);
        }
        close(results[0]);
        close(done[1]); /* let them exit, without freeing */
        for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
        EXPECT(sum <= L, "round %d: %d processes hold %llu > limit %llu", r, n, sum, L);
        EXPECT(sum == L / C * C, "round %d: %d processes got %llu, expected all %llu", r, n, sum, L / C * C);
        if (t_failures) break;
    }
    return t_done("t_race");
}
