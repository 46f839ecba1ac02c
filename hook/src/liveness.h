/* "Is the owner of this slot still alive?" across pid namespaces.
 * Each process holds an open-file-description (OFD) write lock on one byte of the shared
 * file that stands for its slot. The kernel drops the lock when the process dies, however
 * it dies, and the lock is visible to every process that opens the same inode, whatever its
 * pid namespace (a pid seen in another container's namespace proves nothing). */
#ifndef GPUSHARE_LIVENESS_H
#define GPUSHARE_LIVENESS_H

#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>

/* A write lock request on the one byte at `offset`. */
static inline struct flock gs_byte_lock(long offset)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = offset;
    fl.l_len = 1;
    return fl;
}

/* Take the byte lock for our slot; 0 on success, -1 if someone holds it. */
static inline int gs_live_claim(int fd, long offset)
{
    struct flock fl = gs_byte_lock(offset);
    return fcntl(fd, F_OFD_SETLK, &fl) == 0 ? 0 : -1;
}

/* 1 if a live process (other than through fd itself) holds the byte lock. Errors count as
 * alive: never reclaim what we cannot prove dead. */
static inline int gs_live_held(int fd, long offset)
{
    struct flock fl = gs_byte_lock(offset);
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return 1;
    return fl.l_type != F_UNLCK;
}

#endif
