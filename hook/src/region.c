/* Shared usage region: reservation, release and reclamation of dead processes' usage.
 * Invariant (under the robust mutex): hdr->used == sum of slots[i].used over in-use slots,
 * and hdr->used <= limit after every successful reservation. */
#define _GNU_SOURCE
#include "region.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "liveness.h"
#include "log.h"

uint64_t gs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static long slot_offset(int i) { return (long)GS_HEADER_SIZE + (long)i * GS_SLOT_SIZE; }

static void init_region(void *base)
{
    struct gs_region_header *h = base;
    memset(base, 0, GS_REGION_SIZE);
    h->version = GS_REGION_VERSION;
    h->header_size = GS_HEADER_SIZE;
    h->slot_size = GS_SLOT_SIZE;
    h->slot_count = GS_SLOT_COUNT;
    h->region_size = GS_REGION_SIZE;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    /* robust: a process killed while holding the lock must not block the others */
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->lock.m, &a);
    pthread_mutexattr_destroy(&a);
    /* magic last: a region is usable only once everything above is in place */
    __atomic_store_n(&h->magic, GS_REGION_MAGIC, __ATOMIC_RELEASE);
}

static int check_header(const struct gs_region_header *h, const char *path)
{
    uint64_t magic = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);
    if (magic != GS_REGION_MAGIC) {
        gs_log("region %s is corrupt (magic %#llx); failing closed for this GPU", path,
               (unsigned long long)magic);
        return -1;
    }
    if (h->version != GS_REGION_VERSION) {
        gs_log("region %s has unknown version %u (this library knows %u); failing closed for this GPU",
               path, h->version, GS_REGION_VERSION);
        return -1;
    }
    if (h->header_size != GS_HEADER_SIZE || h->slot_size != GS_SLOT_SIZE ||
        h->slot_count != GS_SLOT_COUNT || h->region_size != GS_REGION_SIZE) {
        gs_log("region %s is corrupt (layout fields do not match); failing closed for this GPU", path);
        return -1;
    }
    return 0;
}

int gs_region_open(struct gs_region *r, const char *path)
{
    memset(r, 0, sizeof *r);
    r->slot = -1;
    r->lock_fd = -1;
    if (!path) { /* per-process accounting: same code on a private page set */
        void *p = mmap(NULL, GS_REGION_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            gs_log("cannot map a private region: %s", strerror(errno));
            return -1;
        }
        init_region(p);
        r->hdr = p;
        r->slots = (struct gs_slot *)((char *)p + GS_HEADER_SIZE);
        return 0;
    }
    snprintf(r->path, sizeof r->path, "%s", path);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        gs_log("cannot open region %s: %s; failing closed for this GPU", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size != GS_REGION_SIZE) {
        gs_log("region %s has size %lld, expected %u; failing closed for this GPU", path,
               (long long)st.st_size, GS_REGION_SIZE);
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, GS_REGION_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        gs_log("cannot map region %s: %s; failing closed for this GPU", path, strerror(errno));
        close(fd);
        return -1;
    }
    struct gs_region_header *h = p;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == 0) {
        /* created zero-filled by the kubelet plugin: the first user initialises it; nobody
         * uses a region before its magic is set, so (re)initialising under flock is safe */
        flock(fd, LOCK_EX);
        if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == 0) init_region(p);
        flock(fd, LOCK_UN);
    }
    /* the mapping keeps the file; the liveness lock uses a description of its own so that a
     * fork child, which inherits the mapping, does not keep the parent's lock alive */
    close(fd);
    if (check_header(h, path) != 0) {
        munmap(p, GS_REGION_SIZE);
        return -1;
    }
    r->hdr = h;
    r->slots = (struct gs_slot *)((char *)p + GS_HEADER_SIZE);
    return 0;
}

static uint32_t slots_hw(const struct gs_region *r)
{
    uint32_t hw = r->hdr->slots_hw;
    return hw > GS_SLOT_COUNT ? GS_SLOT_COUNT : hw; /* the region is tenant-writable */
}

static int open_lock_fd(struct gs_region *r)
{
    if (r->lock_fd < 0) r->lock_fd = open(r->path, O_RDWR | O_CLOEXEC);
    return r->lock_fd;
}

static void recompute_locked(struct gs_region *r)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < slots_hw(r); i++)
        if (r->slots[i].in_use) sum += r->slots[i].used;
    r->hdr->used = sum;
}

static void reap_locked(struct gs_region *r)
{
    if (!r->path[0] || open_lock_fd(r) < 0) return; /* private region: nobody else */
    for (uint32_t i = 0; i < slots_hw(r); i++) {
        struct gs_slot *s = &r->slots[i];
        if (!s->in_use || (int)i == r->slot || gs_live_held(r->lock_fd, slot_offset(i))) continue;
        uint64_t u = s->used < r->hdr->used ? s->used : r->hdr->used;
        r->hdr->used -= u;
        memset(s, 0, sizeof *s);
        r->hdr->reaped++;
    }
}

static uint64_t proc_start_time(void)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* comm may contain spaces */
    if (!p) return 0;
    for (int field = 2; field < 22 && p; field++) p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

static int register_locked(struct gs_region *r)
{
    if (!r->path[0]) {
        r->slot = 0;
        r->slots[0].in_use = 1;
        if (r->hdr->slots_hw < 1) r->hdr->slots_hw = 1;
        return 0;
    }
    if (open_lock_fd(r) < 0) return -1;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < GS_SLOT_COUNT; i++) {
            struct gs_slot *s = &r->slots[i];
            if (s->in_use || gs_live_claim(r->lock_fd, slot_offset(i)) != 0) continue;
            struct stat st;
            s->pid = getpid();
            s->start_time = proc_start_time();
            s->pidns = stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
            s->used = 0;
            s->in_use = 1;
            if (i >= r->hdr->slots_hw) r->hdr->slots_hw = i + 1;
            r->slot = (int)i;
            return 0;
        }
        reap_locked(r);
    }
    gs_log("region %s: no free usage slot", r->path);
    return -1;
}

static int region_lock(struct gs_region *r)
{
    int rc = pthread_mutex_lock(&r->hdr->lock.m);
    if (rc == EOWNERDEAD) {
        /* the holder died mid-update: totals may disagree with the slots */
        recompute_locked(r);
        reap_locked(r);
        pthread_mutex_consistent(&r->hdr->lock.m);
        return 0;
    }
    return rc == 0 ? 0 : -1;
}

static void region_unlock(struct gs_region *r) { pthread_mutex_unlock(&r->hdr->lock.m); }

static int fits(uint64_t used, uint64_t size, uint64_t limit)
{
    return used <= limit && size <= limit - used; /* no overflow for any size */
}

int gs_region_reserve(struct gs_region *r, uint64_t size, uint64_t limit)
{
    if (region_lock(r) != 0) return -1;
    int rc = -1;
    if (r->slot < 0 && register_locked(r) != 0) goto out;
    if (!fits(r->hdr->used, size, limit)) reap_locked(r); /* maybe dead processes hold it */
    if (fits(r->hdr->used, size, limit)) {
        r->slots[r->slot].used += size;
        if (r->fault_stop) raise(SIGSTOP); /* test only: die here, holding the lock */
        r->hdr->used += size;
        rc = 0;
    } else {
        __atomic_add_fetch(&r->hdr->oom_refusals, 1, __ATOMIC_RELAXED);
    }
out:
    region_unlock(r);
    return rc;
}

void gs_region_release(struct gs_region *r, uint64_t size)
{
    if (size == 0 || region_lock(r) != 0) return;
    if (r->slot >= 0) {
        struct gs_slot *s = &r->slots[r->slot];
        uint64_t u = size < s->used ? size : s->used;
        s->used -= u;
        r->hdr->used -= u < r->hdr->used ? u : r->hdr->used;
    }
    region_unlock(r);
}

uint64_t gs_region_used(struct gs_region *r)
{
    return __atomic_load_n(&r->hdr->used, __ATOMIC_RELAXED);
}

void gs_region_reap(struct gs_region *r, uint64_t min_interval_ns)
{
    uint64_t now = gs_now_ns();
    if (now - __atomic_load_n(&r->last_reap_ns, __ATOMIC_RELAXED) < min_interval_ns) return;
    __atomic_store_n(&r->last_reap_ns, now, __ATOMIC_RELAXED);
    if (region_lock(r) != 0) return;
    reap_locked(r);
    region_unlock(r);
}

void gs_region_forget_slot(struct gs_region *r)
{
    if (!r->hdr) return;
    if (!r->path[0]) { /* private copy: the child owns none of the parent's memory */
        init_region(r->hdr);
        r->slot = -1;
        return;
    }
    if (r->lock_fd >= 0) close(r->lock_fd); /* the parent's description keeps its lock */
    r->lock_fd = -1;
    r->slot = -1;
}
