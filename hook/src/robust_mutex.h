/* A process-shared robust mutex in shared memory: a process killed while holding it must not
 * block the others (the next locker gets EOWNERDEAD). Used by the usage region and by the
 * simulated driver's state file. */
#ifndef GPUSHARE_ROBUST_MUTEX_H
#define GPUSHARE_ROBUST_MUTEX_H

#include <pthread.h>

static inline void gs_robust_mutex_init(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

#endif
