/* Open addressing with linear probing and backward-shift deletion (no tombstones). */
#include "ptrmap.h"

#include <stdlib.h>
#include <string.h>

static size_t slot_of(uint64_t key, int kind, size_t cap)
{
    uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static int same(const struct gs_ptr_entry *e, int kind, uint64_t key)
{
    return e->key == key && e->kind == kind;
}

static void insert_raw(struct gs_ptr_entry *tab, size_t cap, const struct gs_ptr_entry *e)
{
    size_t i = slot_of(e->key, e->kind, cap);
    while (tab[i].key) i = (i + 1) & (cap - 1);
    tab[i] = *e;
}

static int grow(struct gs_ptrmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    struct gs_ptr_entry *tab = calloc(cap, sizeof *tab);
    if (!tab) return -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->tab[i].key) insert_raw(tab, cap, &m->tab[i]);
    free(m->tab);
    m->tab = tab;
    m->cap = cap;
    return 0;
}

int gs_ptrmap_put(struct gs_ptrmap *m, int kind, uint64_t key, uint64_t size, int gpu)
{
    struct gs_ptr_entry e = {key, size, gpu, kind, 0};
    return gs_ptrmap_put_entry(m, &e);
}

int gs_ptrmap_put_entry(struct gs_ptrmap *m, const struct gs_ptr_entry *in)
{
    struct gs_ptr_entry e = *in;
    int kind = e.kind, rc = 0;
    if (!e.key) e.key = 1;
    pthread_mutex_lock(&m->lock);
    if ((m->count + 1) * 2 > m->cap && grow(m) != 0) {
        rc = -1;
    } else {
        size_t i = slot_of(e.key, kind, m->cap);
        while (m->tab[i].key && !same(&m->tab[i], kind, e.key)) i = (i + 1) & (m->cap - 1);
        if (!m->tab[i].key) m->count++;
        m->tab[i] = e;
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int gs_ptrmap_take(struct gs_ptrmap *m, int kind, uint64_t key, struct gs_ptr_entry *out)
{
    int found = 0;
    if (!key) key = 1;
    pthread_mutex_lock(&m->lock);
    if (m->cap) {
        size_t mask = m->cap - 1, i = slot_of(key, kind, m->cap);
        while (m->tab[i].key && !same(&m->tab[i], kind, key)) i = (i + 1) & mask;
        if (m->tab[i].key) {
            *out = m->tab[i];
            found = 1;
            m->count--;
            /* backward shift: pull later entries of the cluster into the hole */
            size_t hole = i, j = i;
            for (;;) {
                j = (j + 1) & mask;
                if (!m->tab[j].key) break;
                size_t home = slot_of(m->tab[j].key, m->tab[j].kind, m->cap);
                /* move j to hole unless home lies cyclically in (hole, j] */
                if (((j - home) & mask) >= ((j - hole) & mask)) {
                    m->tab[hole] = m->tab[j];
                    hole = j;
                }
            }
            m->tab[hole].key = 0;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return found;
}

void gs_ptrmap_reset_child(struct gs_ptrmap *m)
{
    pthread_mutex_init(&m->lock, NULL);
    if (m->tab) memset(m->tab, 0, m->cap * sizeof *m->tab);
    m->count = 0;
}
