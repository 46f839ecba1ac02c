/* A process that never calls CUDA, with the library preloaded: prints what it holds
 * (fds, threads, mappings of the driver or a region) after using dlsym, fork and threads. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int count_dir(const char *path)
{
    DIR *d = opendir(path);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += e->d_name[0] != '.';
    closedir(d);
    return n - (strcmp(path, "/proc/self/fd") == 0); /* the DIR's own fd */
}

static void *nothing(void *a) { return a; }

/* pthread_join returns once the thread's tid is cleared, which the kernel does before it
 * removes the task from /proc/self/task: wait (up to 2 s) for the count to settle, so an
 * exited thread is not counted, while one that stays (a thread of the library) still is. */
static int settled_threads(void)
{
    int n = count_dir("/proc/self/task");
    for (int i = 0; i < 200 && n > 1; i++) {
        usleep(10000);
        n = count_dir("/proc/self/task");
    }
    return n;
}

int main(void)
{
    if (!dlsym(RTLD_DEFAULT, "printf")) return 2;
    pthread_t t;
    pthread_create(&t, NULL, nothing, NULL);
    pthread_join(t, NULL);
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    int mapped = 0;
    char line[4096];
    FILE *f = fopen("/proc/self/maps", "r");
    while (fgets(line, sizeof line, f))
        mapped += strstr(line, "libcuda") || strstr(line, "nvidia-ml") || strstr(line, "/region/");
    fclose(f);
    printf("fds=%d threads=%d driver_or_region_mappings=%d\n", count_dir("/proc/self/fd"),
           settled_threads(), mapped);
    return 0;
}
