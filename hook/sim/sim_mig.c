/* Simulated MIG: NVIDIA's profile tables and what a process inside an instance is (sim_mig.h). */
#define _GNU_SOURCE
#include "sim_mig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_state.h"

#define ALL7 0x7fu /* starts 0..6 */

/* NVIDIA MIG User Guide, "Supported MIG Profiles" (H100 80GB: fractions of memory and SMs, engines,
 * instance counts) with the IDs, SMs and memory nvidia-smi mig -lgip lists and the placements of
 * nvidia-smi mig -lgipp (docs/mig.md). nvml_profile: NVML_GPU_INSTANCE_PROFILE_1_SLICE (0),
 * _2_SLICE (1), _3_SLICE (2), _4_SLICE (3), _7_SLICE (4), _1_SLICE_REV1 (7, "+me"), _1_SLICE_REV2 (9). */
static const struct sim_mig_profile h100_80gb[] = {
    /* nvml id  name              g  n  SMs CE DEC ENC JPG OFA  MiB    size starts */
    {0, 19, "MIG 1g.10gb",    1, 7, 16,  1, 1, 0, 1, 0, 9984,  1, ALL7},
    {7, 20, "MIG 1g.10gb+me", 1, 1, 16,  1, 1, 0, 1, 1, 9984,  1, ALL7},
    {9, 15, "MIG 1g.20gb",    1, 4, 26,  1, 1, 0, 1, 0, 20096, 2, 0x55u},
    {1, 14, "MIG 2g.20gb",    2, 3, 32,  2, 2, 0, 2, 0, 20096, 2, 0x15u},
    {2, 9,  "MIG 3g.40gb",    3, 2, 60,  3, 3, 0, 3, 0, 40448, 4, 0x11u},
    {3, 5,  "MIG 4g.40gb",    4, 1, 64,  4, 4, 0, 4, 0, 40448, 4, 0x01u},
    {4, 0,  "MIG 7g.80gb",    7, 1, 132, 8, 7, 0, 7, 1, 81152, 8, 0x01u},
};
/* the same for the A100-SXM4-80GB (the guide's A100 table, names for 80GB) */
static const struct sim_mig_profile a100_80gb[] = {
    {0, 19, "MIG 1g.10gb",    1, 7, 14, 1, 0, 0, 0, 0, 9728,  1, ALL7},
    {7, 20, "MIG 1g.10gb+me", 1, 1, 14, 1, 1, 0, 1, 1, 9728,  1, ALL7},
    {9, 15, "MIG 1g.20gb",    1, 4, 14, 1, 1, 0, 0, 0, 19968, 2, 0x55u},
    {1, 14, "MIG 2g.20gb",    2, 3, 28, 2, 1, 0, 0, 0, 19968, 2, 0x15u},
    {2, 9,  "MIG 3g.40gb",    3, 2, 42, 3, 2, 0, 0, 0, 40192, 4, 0x11u},
    {3, 5,  "MIG 4g.40gb",    4, 1, 56, 4, 2, 0, 0, 0, 40192, 4, 0x01u},
    {4, 0,  "MIG 7g.80gb",    7, 1, 98, 7, 5, 0, 1, 1, 80896, 8, 0x01u},
};

const struct sim_mig_profile *sim_mig_table(unsigned table, unsigned *count)
{
    if (table == SIM_MIG_TABLE_A100_80GB) {
        *count = sizeof a100_80gb / sizeof a100_80gb[0];
        return a100_80gb;
    }
    *count = sizeof h100_80gb / sizeof h100_80gb[0];
    return h100_80gb;
}

const struct sim_mig_profile *sim_mig_profile_of(int dev, const struct sim_mig_gi *gi)
{
    unsigned n;
    const struct sim_mig_profile *t = sim_mig_table(sim->mig[dev].table, &n);
    return gi->profile < n ? &t[gi->profile] : NULL;
}

/* GPUSHARE_SIM_MIG: the GPUs in MIG mode, "all" or indexes "0,2" (what `nvidia-smi -i N -mig 1`
 * did before the node started); GPUSHARE_SIM_MIG_PRODUCT: H100-80GB (default) or A100-80GB. */
void sim_mig_init(struct sim_mig *mig)
{
    const char *on = getenv("GPUSHARE_SIM_MIG");
    const char *product = getenv("GPUSHARE_SIM_MIG_PRODUCT");
    unsigned table = product && strcmp(product, "A100-80GB") == 0 ? SIM_MIG_TABLE_A100_80GB : SIM_MIG_TABLE_H100_80GB;
    for (unsigned d = 0; d < SIM_MAX_DEV; d++) {
        mig[d].table = table;
        mig[d].mode = 0;
    }
    if (!on || !*on) return;
    if (strcmp(on, "all") == 0) {
        for (unsigned d = 0; d < SIM_MAX_DEV; d++) mig[d].mode = 1;
        return;
    }
    char buf[128];
    snprintf(buf, sizeof buf, "%s", on);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        unsigned long d = strtoul(tok, &end, 10);
        if (*end == 0 && end != tok && d < SIM_MAX_DEV) mig[d].mode = 1;
        else fprintf(stderr, "gpushare-sim: GPUSHARE_SIM_MIG: %s is not a GPU index (accepted: all, or 0,2)\n", tok);
    }
}

/* A MIG device's UUID: new with every GPU instance (serial), as the real driver gives each its own */
void sim_mig_uuid(int dev, unsigned serial, char *out, unsigned len)
{
    snprintf(out, len, "MIG-5ea1c0de-%04x-4000-9000-%012x", (unsigned)dev, serial);
}

int sim_mig_visible(int *dev, int *gi)
{
    static int cached = -2, c_dev, c_gi;
    if (cached == -2) {
        cached = -1;
        const char *v = getenv("CUDA_VISIBLE_DEVICES");
        char uuid[96];
        for (unsigned d = 0; v && strncmp(v, "MIG-", 4) == 0 && d < sim->ndev; d++)
            for (int g = 0; g < SIM_MIG_MAX_GI; g++) {
                struct sim_mig_gi *x = &sim->mig[d].gi[g];
                if (!x->in_use || !x->ci_in_use) continue;
                sim_mig_uuid((int)d, x->serial, uuid, sizeof uuid);
                if (strncmp(v, uuid, strlen(uuid)) == 0) {
                    cached = 0;
                    c_dev = (int)d;
                    c_gi = g;
                }
            }
    }
    if (cached == 0) {
        *dev = c_dev;
        *gi = c_gi;
    }
    return cached;
}
