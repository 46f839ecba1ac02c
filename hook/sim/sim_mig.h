/* Simulated MIG (Multi-Instance GPU) as NVIDIA documents it for the H100 80GB and A100 80GB
 * (docs/mig.md cites the tables): GPU instance profiles, their placements on the 8 memory
 * slices, and the GPU and compute instances NVML creates and destroys. One GPU instance holds
 * at most one compute instance here (the whole instance's compute), which is what the kubelet
 * plugin creates; NVML's many-CIs-per-GI layouts are not simulated. */
#ifndef GPUSHARE_SIM_MIG_H
#define GPUSHARE_SIM_MIG_H

#include <stdint.h>

#define SIM_MIG_SLICES 8     /* memory slices of a GPU; placements are in these units */
#define SIM_MIG_MAX_GI 8     /* GPU instances per GPU at most (7 on both products, one spare slot) */
#define SIM_MIG_TABLE_H100_80GB 0u
#define SIM_MIG_TABLE_A100_80GB 1u

struct sim_mig_profile {
    unsigned nvml_profile;   /* NVML_GPU_INSTANCE_PROFILE_* (the index nvmlDeviceGetGpuInstanceProfileInfo takes) */
    unsigned id;             /* the profile's ID (nvidia-smi mig -lgip "ID") */
    const char *name;        /* "MIG 1g.10gb" as NVML names it */
    unsigned compute_slices; /* the "Ng" */
    unsigned instances;      /* how many fit on an empty GPU */
    unsigned sms, copy_engines, decoders, encoders, jpegs, ofas;
    unsigned long long memory_mib;
    unsigned size;           /* memory slices one placement spans */
    unsigned starts;         /* bit s: a placement may start at memory slice s */
};

/* one GPU instance; in_use 0: a free slot */
struct sim_mig_gi {
    uint32_t in_use, id, profile, start; /* profile: index into the table */
    uint32_t ci_in_use, ci_id;           /* its one compute instance */
    uint32_t serial, pad;                /* its MIG device's UUID (sim_mig_uuid) */
    uint64_t used;                       /* memory in use by processes of the instance (atomic) */
};

struct sim_mig {
    uint32_t mode;   /* 1: MIG enabled (GPUSHARE_SIM_MIG at state creation); the sim never changes it */
    uint32_t table;  /* SIM_MIG_TABLE_* (GPUSHARE_SIM_MIG_PRODUCT) */
    uint32_t serial, pad; /* GPU instances created so far */
    struct sim_mig_gi gi[SIM_MIG_MAX_GI];
};

const struct sim_mig_profile *sim_mig_table(unsigned table, unsigned *count);
const struct sim_mig_profile *sim_mig_profile_of(int dev, const struct sim_mig_gi *gi);
void sim_mig_init(struct sim_mig mig[]); /* at state creation: mode and table from the environment */
void sim_mig_uuid(int dev, unsigned serial, char *out, unsigned len);   /* "MIG-<uuid>" */
/* The MIG device this process's CUDA_VISIBLE_DEVICES names (its only device), as NVML made it:
 * 0 and *dev, *gi set; -1 when it names none (the process sees the whole GPUs). */
int sim_mig_visible(int *dev, int *gi);

#endif
