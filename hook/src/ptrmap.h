/* Per-process table: what a free releases. Key = (kind, device pointer or handle). */
#ifndef GPUSHARE_PTRMAP_H
#define GPUSHARE_PTRMAP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum gs_kind {
    GS_KIND_PTR = 1, GS_KIND_ARRAY, GS_KIND_MIPMAP, GS_KIND_VMM,
    GS_KIND_VMM_RELEASED, /* key = handle released while mapped: still counted, aux = mappings */
    GS_KIND_MAP,          /* key = mapped address, size = mapping length, aux = handle */
    GS_KIND_CTX_LIMIT,    /* key = (context << 2) | CU_LIMIT_*: bytes counted for that limit */
};

struct gs_ptr_entry {
    uint64_t key;   /* 0 = empty */
    uint64_t size;
    int32_t gpu;    /* limit slot (or device, in the sim) */
    int32_t kind;
    uint64_t aux;   /* GS_KIND_VMM(_RELEASED): live mappings; GS_KIND_MAP: the handle */
};

struct gs_ptrmap {
    pthread_mutex_t lock; /* its own small lock: never held across a driver call */
    struct gs_ptr_entry *tab;
    size_t cap, count;
};

#define GS_PTRMAP_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0}

/* 0 on success, -1 if out of host memory */
int gs_ptrmap_put(struct gs_ptrmap *m, int kind, uint64_t key, uint64_t size, int gpu);
int gs_ptrmap_put_entry(struct gs_ptrmap *m, const struct gs_ptr_entry *e);
/* remove and return the entry; 0 if unknown */
int gs_ptrmap_take(struct gs_ptrmap *m, int kind, uint64_t key, struct gs_ptr_entry *out);
/* fork child: forget everything without taking the (maybe inherited-held) lock */
void gs_ptrmap_reset_child(struct gs_ptrmap *m);

#endif
