/* Is this process a client of a simulated MPS server, and with what active-thread percentage?
 * Names and format: sim_mps.h. Bad values are reported on stderr, one line each, naming the
 * file, line, key and value; a bad server file leaves the process a plain context (a real
 * client that cannot reach its server runs without MPS), a bad client variable is ignored. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim_mps.h"

/* 1..100, digits only; 0 when s is anything else */
static uint32_t percentage(const char *s, size_t n)
{
    uint32_t v = 0;
    if (n == 0 || n > 3) return 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (uint32_t)(s[i] - '0');
    }
    return v >= 1 && v <= 100 ? v : 0;
}

static int server_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > GS_SIM_MPS_SERVER_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ? h : 1;
}

/* the server described in dir's file; {0, 0} when none runs there or the file is bad */
static struct sim_mps_client read_server(const char *dir)
{
    struct sim_mps_client c = {0, 0};
    char path[4096], buf[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, GS_SIM_MPS_FILE) >= (int)sizeof path) return c;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return c; /* no server in that directory: not a client */
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len < 0) len = 0;
    buf[len] = 0;
    uint32_t version = 0, pct = 0;
    const char *server = NULL;
    size_t server_len = 0;
    int line = 0;
    for (const char *p = buf, *next; *p; p = next) {
        size_t n = (size_t)(strchrnul(p, '\n') - p);
        next = p[n] ? p + n + 1 : p + n;
        line++;
        if (n == 0 || p[0] == '#') continue;
        const char *eq = memchr(p, '=', n);
        size_t klen = eq ? (size_t)(eq - p) : n, vlen = eq ? n - klen - 1 : 0;
        const char *v = eq ? eq + 1 : p + n;
        int bad = 0;
        if (eq && klen == strlen(GS_SIM_MPS_KEY_VERSION) && !strncmp(p, GS_SIM_MPS_KEY_VERSION, klen))
            bad = !(vlen == 1 && v[0] == '0' + GS_SIM_MPS_VERSION && (version = GS_SIM_MPS_VERSION));
        else if (eq && klen == strlen(GS_SIM_MPS_KEY_SERVER) && !strncmp(p, GS_SIM_MPS_KEY_SERVER, klen))
            bad = !server_name_ok(v, vlen), server = v, server_len = vlen;
        else if (eq && klen == strlen(GS_SIM_MPS_KEY_THREADS) && !strncmp(p, GS_SIM_MPS_KEY_THREADS, klen))
            bad = !(pct = percentage(v, vlen));
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "gpushare-sim: %s line %d: bad %.*s (expected %s=%u, %s=<name of [A-Za-z0-9._-]{1,%u}>, "
                    "%s=<1..100>); running without MPS\n", path, line, (int)n, p, GS_SIM_MPS_KEY_VERSION,
                    GS_SIM_MPS_VERSION, GS_SIM_MPS_KEY_SERVER, GS_SIM_MPS_SERVER_MAX, GS_SIM_MPS_KEY_THREADS);
            return c;
        }
    }
    if (!version || !server || !pct) {
        fprintf(stderr, "gpushare-sim: %s: missing %s; running without MPS\n", path,
                !version ? GS_SIM_MPS_KEY_VERSION : !server ? GS_SIM_MPS_KEY_SERVER : GS_SIM_MPS_KEY_THREADS);
        return c;
    }
    c.server = fnv1a(server, server_len);
    c.threads_pct = pct;
    return c;
}

struct sim_mps_client sim_mps_connect(void)
{
    const char *dir = getenv(GS_SIM_MPS_PIPE_ENV);
    struct sim_mps_client c = {0, 0};
    if (!dir || !*dir) return c;
    c = read_server(dir);
    const char *own = getenv(GS_SIM_MPS_THREADS_ENV);
    if (!c.server || !own || !*own) return c;
    uint32_t pct = percentage(own, strlen(own));
    if (!pct)
        fprintf(stderr, "gpushare-sim: bad %s=%s (expected 1..100); ignored\n", GS_SIM_MPS_THREADS_ENV, own);
    else if (pct < c.threads_pct) /* the client may only lower its server's limit */
        c.threads_pct = pct;
    return c;
}
