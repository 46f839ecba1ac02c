"""The names an MPS claim's containers, the kubelet plugin and the simulated driver agree on
(docs/interfaces.md, "MPS"; design in docs/strategies.md).

One MPS control daemon per GPU serves every claim on that GPU that chose sharingStrategy MPS;
its folders live under the plugin's state dir, one set per GPU UUID (docs/security.md, "MPS: the
control daemon"): the pipe folder its clients need (mounted read-only into the claims'
containers: a client connects to a socket, which a read-only mount allows, and can create,
replace or link nothing there), the control folder where the plugin talks to it (never mounted:
no container can reach, replace or plant anything there; the daemon keeps its temporary files
there too), and the log folder (never mounted). Names follow
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
# MPS's client priority (NVIDIA's MPS guide, "CUDA_MPS_CLIENT_PRIORITY"): the default priority of
# the client's streams; a tenant may change its own (docs/security.md)
PRIORITY_ENV = "CUDA_MPS_CLIENT_PRIORITY"
PRIORITY_NORMAL, PRIORITY_BELOW_NORMAL = 0, 1

# MPS's own default pipe folder; also where NVIDIA's DRA driver mounts the pipe folder.
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"

# The daemon's socket in a folder (nvidia-cuda-mps-control connects to <folder>/control): in the
# pipe folder for clients; in the control folder for the plugin's commands where the daemon
# listens there (the stand-in, told the folder by CONTROL_DIR_ENV; NVIDIA's daemon takes
# commands in its pipe folder, docs/security.md).
SOCKET = "control"
CONTROL_DIR_ENV = "GPUSHARE_MPS_CONTROL_DIRECTORY"
# The control daemon's pid, in the pipe folder (NVIDIA's MPS documentation, "Utilities and
# Daemons": the daemon writes it into CUDA_MPS_PIPE_DIRECTORY). The plugin checks who answers
# against it, the agent watches it.
PID_FILE = "nvidia-cuda-mps-control.pid"
# In the GPU's folder while the plugin stops its daemon (the GPU's last MPS claim went): the
# agent reports no exit then.
STOPPING = "stopping"

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


def control_dir(state_dir: str, gpu_uuid: str) -> str:
    """The plugin's side of the daemon: 0700, never mounted into a container."""
    return os.path.join(gpu_dir(state_dir, gpu_uuid), "control")


def control_socket(state_dir: str, gpu_uuid: str) -> str:
    return os.path.join(control_dir(state_dir, gpu_uuid), SOCKET)


def shm_dir(state_dir: str, gpu_uuid: str) -> str:
    """The daemon's /dev/shm, mounted at /dev/shm in its clients (an MPS server and its clients
    share memory there)."""
    return os.path.join(gpu_dir(state_dir, gpu_uuid), "shm")


def stopping(state_dir: str, gpu_uuid: str) -> str:
    return os.path.join(gpu_dir(state_dir, gpu_uuid), STOPPING)


def control_log(state_dir: str, gpu_uuid: str) -> str:
    return os.path.join(log_dir(state_dir, gpu_uuid), CONTROL_LOG)


def read_position(state_dir: str, gpu_uuid: str) -> str:
    """Where the node agent has read control.log up to (agent/mpswatch.py): the next leader goes on
    from there, so a server exit logged while no agent ran is still reported. Not in a mount."""
    return os.path.join(gpu_dir(state_dir, gpu_uuid), "agent-read-position")


def mebibytes(value: int) -> str:
    """A byte count as MPS's memory-limit syntax (whole MiB, rounded down: never above the budget)."""
    return f"{max(1, value >> 20)}M"


def read_pid(state_dir: str, gpu_uuid: str) -> int | None:
    """The control daemon's pid from its pid file (never through a link); None: none there."""
    try:
        fd = os.open(os.path.join(pipe_dir(state_dir, gpu_uuid), PID_FILE),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(fd, 32).decode(errors="replace").strip()
    finally:
        os.close(fd)
    return int(text) if text.isdigit() and 0 < int(text) < 1 << 22 else None


def daemon_alive(pid: int | None) -> bool:
    """Whether `pid` is a live MPS control daemon (NVIDIA's or the stand-in): a pid reused by
    another program after a reboot, or a zombie, is not."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"nvidia-cuda-mps-control" in cmd or b"mpscontrol" in cmd
