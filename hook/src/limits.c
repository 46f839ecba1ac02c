/* What does the claim allow? Its limits file (or environment), and the node agent's control
 * file beside it: where they are (docs/interfaces.md), how they are read and parsed. */
#define _GNU_SOURCE
#include "limits.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control.h"
#include "log.h"
#include "rawstat.h"

extern char **environ;

/* strict decimal: digits only, no sign, no overflow */
static int parse_u64(const char *s, uint64_t *out)
{
    if (!*s) return -1;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*s - '0'), &v))
            return -1;
    }
    *out = v;
    return 0;
}

/* "GPUSHARE_MEMORY_LIMIT_3" with prefix "GPUSHARE_MEMORY_LIMIT_" -> 3; -1 if not that key */
static int indexed_key(const char *key, const char *prefix, int *bad)
{
    size_t n = strlen(prefix);
    uint64_t i;
    if (strncmp(key, prefix, n) != 0) return -1;
    if (parse_u64(key + n, &i) != 0 || i >= GS_MAX_GPUS) {
        *bad = 1;
        return -1;
    }
    return (int)i;
}

int gs_limits_parse(struct gs_limits *l, const char *text, int require_version,
                    const char *source, char *err, size_t errlen)
{
    int version_seen = 0, have_count = 0, max_index = -1;
    uint64_t count = 0;
    int have_mem[GS_MAX_GPUS] = {0};
    for (int i = 0; i < GS_MAX_GPUS; i++) l->gpu[i].compute = 100;

    int lineno = 0;
    const char *p = text;
    while (*p) {
        char line[512];
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        lineno++;
        if (len >= sizeof line) {
            snprintf(err, errlen, "%s:%d: line too long", source, lineno);
            return -1;
        }
        memcpy(line, p, len);
        line[len] = 0;
        p += len + (nl ? 1 : 0);
        if (len && line[len - 1] == '\r') line[--len] = 0;
        if (len == 0 || line[0] == '#') continue;
        char *eq = strchr(line, '=');
        if (!eq || eq == line) {
            snprintf(err, errlen, "%s:%d: not KEY=VALUE: '%.80s'", source, lineno, line);
            return -1;
        }
        *eq = 0;
        const char *key = line, *val = eq + 1;
        int bad = 0, i;
        uint64_t v = 0;
        if (strcmp(key, "GPUSHARE_LIMITS_VERSION") == 0) {
            if (parse_u64(val, &v) != 0 || v != 1) goto bad_value;
            version_seen = 1;
        } else if (strcmp(key, "GPUSHARE_GPU_COUNT") == 0) {
            if (parse_u64(val, &count) != 0 || count < 1 || count > GS_MAX_GPUS) goto bad_value;
            have_count = 1;
        } else if ((i = indexed_key(key, "GPUSHARE_MEMORY_LIMIT_", &bad)) >= 0) {
            if (parse_u64(val, &v) != 0 || v == 0) goto bad_value;
            l->gpu[i].memory = v;
            have_mem[i] = 1;
            if (i > max_index) max_index = i;
        } else if ((i = indexed_key(key, "GPUSHARE_COMPUTE_LIMIT_", &bad)) >= 0) {
            if (parse_u64(val, &v) != 0 || v < 1 || v > 100) goto bad_value;
            l->gpu[i].compute = (int)v;
        } else if ((i = indexed_key(key, "GPUSHARE_COMPUTE_POLICY_", &bad)) >= 0) {
            if (strcmp(val, "Hard") == 0) l->gpu[i].burst = 0;
            else if (strcmp(val, "Burst") == 0) l->gpu[i].burst = 1;
            else goto bad_value;
        } else if ((i = indexed_key(key, "GPUSHARE_SM_COUNT_", &bad)) >= 0) {
            if (parse_u64(val, &v) != 0 || v < 1 || v > 100000) goto bad_value;
            l->gpu[i].sm_count = (uint32_t)v;
        } else if (strcmp(key, "GPUSHARE_SHARING_STRATEGY") == 0) {
            if (strcmp(val, "MPS") == 0) l->mps = 1;
            else if (strcmp(val, "TimeSlicing") == 0 || strcmp(val, "None") == 0) l->mps = 0;
            else goto bad_value;
        } else if ((i = indexed_key(key, "GPUSHARE_DEVICE_UUID_", &bad)) >= 0) {
            if (strlen(val) >= sizeof l->gpu[i].uuid) goto bad_value;
            strcpy(l->gpu[i].uuid, val);
        }
        if (bad) goto bad_value; /* a known key with a bad index */
        continue;
    bad_value:
        snprintf(err, errlen, "%s:%d: bad value '%.80s' for %.80s", source, lineno, val, key);
        return -1;
    }
    if (require_version && !version_seen) {
        snprintf(err, errlen, "%s: no GPUSHARE_LIMITS_VERSION=1 line", source);
        return -1;
    }
    l->count = have_count ? (int)count : max_index + 1;
    if (l->count < 1) {
        snprintf(err, errlen, "%s: no GPUSHARE_MEMORY_LIMIT_<i>", source);
        return -1;
    }
    for (int i = 0; i < l->count; i++) {
        if (!have_mem[i]) {
            snprintf(err, errlen, "%s: GPUSHARE_MEMORY_LIMIT_%d missing", source, i);
            return -1;
        }
    }
    return 0;
}

static int read_file(const char *path, char *buf, size_t size, int *exists)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *exists = fd >= 0 || errno != ENOENT;
    if (fd < 0) return -1;
    size_t n = 0;
    ssize_t r;
    while (n < size - 1 && (r = read(fd, buf + n, size - 1 - n)) > 0) n += (size_t)r;
    int tail = n == size - 1; /* too large to be ours */
    close(fd);
    buf[n] = 0;
    if (tail || memchr(buf, 0, n)) return -1;
    return 0;
}

static void load_file(struct gs_limits *l, const char *dir, enum gs_mode mode, int *found)
{
    char path[4200], text[16384], err[512];
    int exists;
    snprintf(path, sizeof path, "%s/limits", dir);
    int rc = read_file(path, text, sizeof text, &exists);
    *found = exists;
    if (!exists) return;
    l->mode = mode;
    snprintf(l->dir, sizeof l->dir, "%s", dir);
    if (rc != 0) {
        gs_log("cannot read limits file %s; failing closed (every allocation is refused)", path);
        l->failed = 1;
    } else if (gs_limits_parse(l, text, 1, path, err, sizeof err) != 0) {
        gs_log("%s; failing closed (every allocation is refused)", err);
        l->failed = 1;
    }
}

void gs_limits_load(struct gs_limits *l)
{
    memset(l, 0, sizeof *l);
    int found;
    /* 1. the mounted file is authoritative: environment and overrides are ignored */
    load_file(l, GS_SYSTEM_DIR, GS_MODE_SYSTEM, &found);
    if (found) return;
    /* 2. tests and host runs */
    const char *run_dir = getenv("GPUSHARE_RUN_DIR");
    if (run_dir && *run_dir) {
        load_file(l, run_dir, GS_MODE_RUN_DIR, &found);
        if (found) return;
    }
    /* 3. the environment alone: per-process accounting */
    char text[16384];
    size_t n = 0;
    int any = 0;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "GPUSHARE_", 9) != 0) continue;
        if (strncmp(*e, "GPUSHARE_MEMORY_LIMIT_", 22) == 0) any = 1;
        size_t len = strlen(*e);
        if (n + len + 2 > sizeof text) break;
        memcpy(text + n, *e, len);
        n += len;
        text[n++] = '\n';
    }
    text[n] = 0;
    if (!any) return; /* 4. not under a claim */
    l->mode = GS_MODE_ENV;
    char err[512];
    if (gs_limits_parse(l, text, 0, "environment", err, sizeof err) != 0) {
        gs_log("%s; failing closed (every allocation is refused)", err);
        l->failed = 1;
    }
}

/* The agent's control file of GPU i, mapped read-only. NULL = none: missing (a claim prepared
 * by an older plugin) or unusable. It is root-owned, so a bad one is a bug, not an attack:
 * one log line, and pacing falls back to the region's rate and the limit. All zeros is fine
 * (the agent has not written it yet); the header is checked again with every rate read. */
const struct gs_control *gs_control_open(const char *dir, int i)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/control/%d", dir, i);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) gs_log("cannot open control file %s: %s; ignored", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    void *p = MAP_FAILED;
    if (gs_fstat(fd, &st) != 0 || st.st_size != GS_CONTROL_SIZE)
        gs_log("control file %s has size %lld, expected %u; ignored", path, (long long)st.st_size,
               GS_CONTROL_SIZE);
    else if ((p = mmap(NULL, GS_CONTROL_SIZE, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
        gs_log("cannot map control file %s: %s; ignored", path, strerror(errno));
    close(fd); /* the mapping keeps the file */
    if (p == MAP_FAILED) return NULL;
    const struct gs_control *c = p;
    uint64_t magic = __atomic_load_n(&c->magic, __ATOMIC_ACQUIRE);
    if (magic != 0 && (magic != GS_CONTROL_MAGIC || c->version != GS_CONTROL_VERSION)) {
        gs_log("control file %s has magic %#llx version %u, expected %#llx version %u; ignored", path,
               (unsigned long long)magic, c->version, (unsigned long long)GS_CONTROL_MAGIC, GS_CONTROL_VERSION);
        munmap(p, GS_CONTROL_SIZE);
        return NULL;
    }
    return c;
}
