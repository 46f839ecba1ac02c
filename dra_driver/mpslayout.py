"""The names an MPS claim's containers, the kubelet plugin and the simulated driver agree on
(docs/interfaces.md, "MPS"; design in docs/strategies.md).

One MPS control daemon per GPU serves every claim on that GPU that chose sharingStrategy MPS;
its pipe and log folders live under the plugin's state dir, one pair per GPU UUID. Names follow
NVIDIA's nvidia-cuda-mps-control(1): a client finds its control daemon through
CUDA_MPS_PIPE_DIRECTORY; the daemon writes control.log into CUDA_MPS_LOG_DIRECTORY; a client may
lower its own share with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / CUDA_MPS_PINNED_DEVICE_MEM_LIMIT but
never raise it past what the daemon set for its server.
"""

from __future__ import annotations

import os

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
THREAD_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PINNED_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"

# MPS's own default pipe folder; also where NVIDIA's DRA driver mounts the pipe folder.
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"

# Commands of nvidia-cuda-mps-control's stdin protocol that the plugin sends.
SET_DEFAULT_THREADS = "set_default_active_thread_percentage"   # <percent>: servers started later
SET_THREADS = "set_active_thread_percentage"                   # <server pid> <percent>: a running server
SET_DEFAULT_PINNED = "set_default_device_pinned_mem_limit"     # <device> <value, e.g. 4096M>
SET_PINNED = "set_device_pinned_mem_limit"                     # <server pid> <device> <value>
GET_SERVERS = "get_server_list"                                # one server pid a line
QUIT = "quit"


def gpu_dir(state_dir: str, gpu_uuid: str) -> str:
    """<state-dir>/mps/<gpu uuid>: the GPU's control daemon's folders."""
    return os.path.join(state_dir, "mps", gpu_uuid)


def pipe_dir(state_dir: str, gpu_uuid: str) -> str:
    return os.path.join(gpu_dir(state_dir, gpu_uuid), "pipe")


def log_dir(state_dir: str, gpu_uuid: str) -> str:
    return os.path.join(gpu_dir(state_dir, gpu_uuid), "log")


def mebibytes(value: int) -> str:
    """A byte count as MPS's memory-limit syntax (whole MiB, rounded down: never above the budget)."""
    return f"{max(1, value >> 20)}M"
