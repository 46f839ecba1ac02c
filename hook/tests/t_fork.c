/* fork() in a CUDA process: the child gets its own usage slot, sees the parent's usage,
 * cannot release the parent's memory, and its memory comes back when it dies.
 * usage: t_fork LIMIT */
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"

int main(int argc, char **argv)
{
    if (argc < 2) return 64;
    unsigned long long L = strtoull(argv[1], NULL, 10), half = L / 2;
    t_setup(0);
    CUdeviceptr a, b, c;
    EXPECT_RC(cuMemAlloc_v2(&a, half), CUDA_SUCCESS);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        EXPECT(t_used() == half, "child sees usage %llu, want %llu", t_used(), half);
        EXPECT_RC(cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE); /* not the child's memory */
        EXPECT(t_used() == half, "child's free of the parent's pointer changed usage: %llu", t_used());
        EXPECT_RC(cuMemAlloc_v2(&b, L - half), CUDA_SUCCESS);
        EXPECT_RC(cuMemAlloc_v2(&c, 1), CUDA_ERROR_OUT_OF_MEMORY);
        fflush(stdout);
        _exit(t_failures ? 1 : 0); /* dies holding L - half */
    }
    int st;
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed");
    EXPECT_RC(cuMemAlloc_v2(&b, L - half), CUDA_SUCCESS); /* the dead child's share is reclaimed */
    EXPECT_RC(cuMemAlloc_v2(&c, 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_RC(cuMemFree_v2(b), CUDA_SUCCESS);
    EXPECT(t_used() == 0, "used %llu", t_used());
    return t_done("t_fork");
}
