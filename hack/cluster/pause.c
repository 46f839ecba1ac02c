/* The pod sandbox's one process, as registry.k8s.io/pause does it: hold the pod's namespaces,
 * reap orphans, exit on SIGINT/SIGTERM. hack/cluster/image builds it static into the image
 * that containerd's config pins as the sandbox image (no registry to pull the real one from). */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void down(int sig) { (void)sig; _exit(0); }

static void reap(int sig)
{
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void)
{
    struct sigaction a = {.sa_handler = down}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &a, NULL);
    sigaction(SIGTERM, &a, NULL);
    sigaction(SIGCHLD, &r, NULL);
    for (;;)
        pause();
}
