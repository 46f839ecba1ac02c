/* stat(2) and fstat(2) straight from the kernel. glibc 2.33 gave stat and fstat a symbol
 * version older glibc lacks (before, they were inline wrappers of __xstat), and the files we
 * inject must load under glibc 2.17 (src/baseline.h). On x86_64 and aarch64 the kernel's
 * struct stat is glibc's. */
#ifndef GPUSHARE_RAWSTAT_H
#define GPUSHARE_RAWSTAT_H

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline int gs_fstat(int fd, struct stat *st) { return (int)syscall(SYS_fstat, fd, st); }

static inline int gs_stat(const char *path, struct stat *st)
{
    return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
}

#endif
