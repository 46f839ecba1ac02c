/* Which of the claim's GPUs is this device? A CUDA device or NVML handle, mapped by UUID (else
 * ordinal) to its limit slot, whose state is opened at first use (devices.c). NULL = a device not
 * under the claim (or no claim): pass through. */
#ifndef GPUSHARE_DEVICES_H
#define GPUSHARE_DEVICES_H

#include "compiler.h"
#include "cuda_abi.h"
#include "state.h"

/* the device of the calling thread's current context: where cuMemAlloc & co allocate */
struct gpu_state *current_gpu(void) GS_HIDDEN;
struct gpu_state *gpu_for_device(CUdevice dev) GS_HIDDEN;
struct gpu_state *gpu_for_nvml(nvmlDevice_t d) GS_HIDDEN;

#endif
