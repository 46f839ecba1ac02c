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

# control.log, in the log folder: the control daemon's lines about its servers, which the node
# agent follows (kubeletplugin/agent/mpswatch.py) and the stand-in daemon writes alike. Each line is
# `[<yyyy-mm-dd hh:mm:ss.mmm> Control <pid, width 5>] <message>`; the messages below as real
# daemons (CUDA 12-13) wrote them in logs posted publicly:
#   NVIDIA/k8s-device-plugin#685 (https://github.com/NVIDIA/k8s-device-plugin/issues/685): a server
#     that failed: "Server encountered a fatal exception. Shutting down", "Server 95 exited with
#     status 1", then "Starting new server 98 for user 0";
#   kubernetes-sigs/dra-driver-nvidia-gpu#1153
#     (https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/pull/1153) and
#     NVIDIA/k8s-device-plugin#1614 (https://github.com/NVIDIA/k8s-device-plugin/issues/1614):
#     "Starting new server 11803 for user 1000", "NEW SERVER 11803: Ready".
CONTROL_LOG = "control.log"
LOG_SERVER_START = "Starting new server {pid} for user {uid}"
LOG_SERVER_READY = "NEW SERVER {pid}: Ready"
LOG_SERVER_FATAL = "Server encountered a fatal exception. Shutting down"
LOG_SERVER_EXIT = "Server {pid} exited with status {status}"


def root(state_dir: str) -> str:
    """<state-dir>/mps: one folder per GPU with a control daemon."""
    return os.path.join(state_dir, "mps")


def gpu_dir(state_dir: str, gpu_uuid: str) -> str:
    """<state-dir>/mps/<gpu uuid>: the GPU's control daemon's folders."""
    return os.path.join(root(state_dir), gpu_uuid)


def pipe_dir(state_dir: str, gpu_uuid: str) -> str:
    return os.path.join(gpu_dir(state_dir, gpu_uuid), "pipe")


def log_dir(state_dir: str, gpu_uuid: str) -> str:
    return os.path.join(gpu_dir(state_dir, gpu_uuid), "log")


def control_log(state_dir: str, gpu_uuid: str) -> str:
    return os.path.join(log_dir(state_dir, gpu_uuid), CONTROL_LOG)


def read_position(state_dir: str, gpu_uuid: str) -> str:
    """Where the node agent has read control.log up to (agent/mpswatch.py): the next leader goes on
    from there, so a server exit logged while no agent ran is still reported. Not in a mount."""
    return os.path.join(gpu_dir(state_dir, gpu_uuid), "agent-read-position")


def mebibytes(value: int) -> str:
    """A byte count as MPS's memory-limit syntax (whole MiB, rounded down: never above the budget)."""
    return f"{max(1, value >> 20)}M"
