/* What does this process hold, and what does a fork child keep of it? The per-GPU state
 * (struct gpu_state, opened by devices.c), the pointer table (memory.c), and the fork handlers
 * that keep both consistent in a child. */
#include "state.h"

struct gpu_state g_gpu[GS_MAX_GPUS];
int g_gpu_open[GS_MAX_GPUS];
pthread_mutex_t g_map_lock = PTHREAD_MUTEX_INITIALIZER;
struct gs_ptrmap g_ptrs = GS_PTRMAP_INIT;

void gs_fork_prepare(void)
{
    pthread_mutex_lock(&g_map_lock);
    pthread_mutex_lock(&g_ptrs.lock);
}

void gs_fork_parent(void)
{
    pthread_mutex_unlock(&g_ptrs.lock);
    pthread_mutex_unlock(&g_map_lock);
}

/* The child owns none of the parent's device memory: it gets its own usage slots (taken
 * on its first allocation) and an empty pointer table. */
void gs_fork_child(void)
{
    pthread_mutex_unlock(&g_ptrs.lock);
    gs_ptrmap_reset_child(&g_ptrs);
    pthread_mutex_init(&g_map_lock, NULL);
    for (int i = 0; i < GS_MAX_GPUS; i++) {
        if (!g_gpu_open[i]) continue;
        struct gpu_state *g = &g_gpu[i];
        if (!g->failed) gs_region_forget_slot(&g->region);
        pthread_mutex_init(&g->sample_lock, NULL);
        pthread_mutex_init(&g->turn_lock, NULL);
        g->turn_me = 0;   /* the child has a token of its own, */
        g->turn_mine = 0; /* and holds no turn */
        g->pending = 0;
        g->my_tat_ns = 0;
        g->my_shared_ns = 0;
        g->mps_ctx = NULL;
        g->ev0 = g->ev1 = NULL; /* events of the parent's contexts */
        g->drain = g->lent = (struct gs_marker){0}; /* markers of the parent's contexts */
    }
}
