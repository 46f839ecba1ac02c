/* The simulated MPS server a process reaches through CUDA_MPS_PIPE_DIRECTORY: the names the
 * trusted side (the plugin's simulated control daemon) and the simulated driver share, in one
 * place. kubeletplugin/hooklayout.py mirrors them (tests/hook/test_hooklayout.py holds the two
 * together); docs/interfaces.md documents them.
 *
 * As with the real MPS, a process is a client when CUDA_MPS_PIPE_DIRECTORY names a directory
 * where a server runs: here, where GS_SIM_MPS_FILE holds a valid description of it, written by
 * the trusted side. Otherwise it runs as a plain context, as a real client does when it cannot
 * reach a control daemon. Its active-thread percentage is the file's; the client's own
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE may only lower it (NVIDIA's MPS documentation, "Environment
 * variables": the variable "will only further constrain the limit set by the control daemon"). */
#ifndef GPUSHARE_SIM_MPS_H
#define GPUSHARE_SIM_MPS_H

#include <stdint.h>

#define GS_SIM_MPS_PIPE_ENV "CUDA_MPS_PIPE_DIRECTORY"
#define GS_SIM_MPS_THREADS_ENV "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"

/* $CUDA_MPS_PIPE_DIRECTORY/gpushare-sim-mps: KEY=VALUE lines, '#' comments, all three keys */
#define GS_SIM_MPS_FILE "gpushare-sim-mps"
#define GS_SIM_MPS_VERSION 1u
#define GS_SIM_MPS_KEY_VERSION "GPUSHARE_SIM_MPS_VERSION"   /* 1 */
#define GS_SIM_MPS_KEY_SERVER "GPUSHARE_SIM_MPS_SERVER"     /* [A-Za-z0-9._-]{1,63}: clients naming
                                                               one server run concurrently */
#define GS_SIM_MPS_KEY_THREADS "GPUSHARE_SIM_MPS_ACTIVE_THREAD_PERCENTAGE" /* 1..100 */
#define GS_SIM_MPS_SERVER_MAX 63u

/* What the process's environment and its server's file make of it. */
struct sim_mps_client {
    uint64_t server;      /* nonzero id of the server (hash of its name); 0: not a client */
    uint32_t threads_pct; /* active-thread percentage, 1..100 */
};

/* Reads the environment and the server's file; one stderr line per bad value, naming it. */
struct sim_mps_client sim_mps_connect(void);

#endif
