/* What does the claim allow? The claim's limits: where they come from (docs/interfaces.md,
 * "Where the library looks") and how they are parsed, read once, at the first CUDA or NVML call;
 * and the node agent's control file of each GPU (control.h), opened with the GPU's state. */
#ifndef GPUSHARE_LIMITS_H
#define GPUSHARE_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#define GS_MAX_GPUS 16
#define GS_SYSTEM_DIR "/var/run/gpushare"

enum gs_mode {
    GS_MODE_NONE = 0, /* not under a claim: pass everything through */
    GS_MODE_SYSTEM,   /* /var/run/gpushare/limits (authoritative) */
    GS_MODE_RUN_DIR,  /* $GPUSHARE_RUN_DIR (tests, host runs) */
    GS_MODE_ENV,      /* GPUSHARE_* variables, per-process accounting */
};

struct gs_gpu_limit {
    char uuid[96];      /* "" = match by ordinal */
    uint64_t memory;    /* bytes, > 0 */
    int compute;        /* percent 1..100 */
    int burst;          /* policy Burst: a node agent may raise the rate above the limit */
    uint32_t sm_count;  /* the GPU's SMs, from the plugin (0: unknown): MPS clients are
                           measured against it (pacing.c, "MPS") */
};

struct gs_limits {
    enum gs_mode mode;
    int failed;                 /* present but unreadable or invalid: fail closed */
    int count;
    int mps;                    /* sharingStrategy MPS: the MPS server may hold compute */
    char dir[4096];             /* folder holding region/<i>; "" in env mode */
    struct gs_gpu_limit gpu[GS_MAX_GPUS];
};

/* Parse KEY=VALUE text. Returns 0, or -1 with a message naming source, line and value. */
int gs_limits_parse(struct gs_limits *l, const char *text, int require_version,
                    const char *source, char *err, size_t errlen);
/* Lookup order of docs/interfaces.md; logs one line on failure. */
void gs_limits_load(struct gs_limits *l);
/* The agent's control file of GPU i in dir (dir/control/i), mapped read-only; NULL = none or
 * unusable (one log line unless it is simply missing). */
struct gs_control;
const struct gs_control *gs_control_open(const char *dir, int i);

#endif
