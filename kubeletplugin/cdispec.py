"""The CDI spec of one prepared claim.

Design: everything a container needs from the claim (env for all its GPUs, limits file,
regions, control files, library, ld.so.preload, device nodes) is in the *spec-level* containerEdits,
which a runtime applies once per container that gets any device of the spec. A container
holds one gpushare claim, and it may be given several of the claim's device IDs (one per
request it uses) without getting duplicate mounts. Each device entry only sets an
informational `GPUSHARE_ALLOCATION_<k>` (CDI rejects devices without edits).

By sharing strategy (docs/strategies.md): TimeSlicing as above; MPS adds the GPU's MPS pipe
folder and the client's limits (the library holds the claim's processes together to the share
in SM-time); None injects no library,
limits file, region or preload: device nodes, GPUSHARE_CLAIM_UID, GPUSHARE_SHARING_STRATEGY only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cdi import ContainerEdits, Device, DeviceNode, Mount, Spec, SpecDir
from dra_driver.config import LATENCY, MPS
from kubeletplugin.strategies.mps import layout as mpslayout

from .claimfiles import CONTAINER_LIBRARY, ClaimFiles
from .prepared import PreparedClaim

KIND = "k8s.gpushare.dev/claim"
CONTAINER_LIMITS = "/var/run/gpushare/limits"
CONTAINER_REGION_DIR = "/var/run/gpushare/region"
CONTAINER_CONTROL_DIR = "/var/run/gpushare/control"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_SIM_DIR = "/usr/local/gpushare/sim"
CONTAINER_SIM_STATE = "/var/run/gpushare/sim.state"
VISIBLE_ENV_PREFIX = "GPUSHARE_SIM_VISIBLE_"  # + the claim uid: its GPUs, as device nodes would
STRATEGY_ENV = "GPUSHARE_SHARING_STRATEGY"
SIM_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")

_RO = ["ro", "nosuid", "nodev", "bind"]
_RW = ["rw", "nosuid", "nodev", "bind"]


@dataclass(frozen=True)
class SimDriver:
    """The simulated CUDA driver and NVML, given to containers on mock-GPU nodes.

    Every container on the node maps one state file, so they all see the same simulated
    devices (memory in use, kernel timeline), as containers on a real GPU see one device.
    """

    host_dir: str  # holds libcuda.so.1 and libnvidia-ml.so.1
    state_path: str  # host file shared by every container of the node
    devices: int
    memory_bytes: int
    mig: str = ""  # the simulated GPUs in MIG mode ("0,2"; GPUSHARE_SIM_MIG), as the mock GPUs' migMode says

    @staticmethod
    def find(library_dir: str) -> str | None:
        """`<folder of libgpushare.so>/sim` when it holds the simulated libraries."""
        sim_dir = os.path.join(library_dir, "sim")
        return sim_dir if all(os.path.exists(os.path.join(sim_dir, n)) for n in SIM_LIBRARIES) else None

    def env(self, state_path: str) -> dict[str, str]:
        """What the simulated driver reads; the state file is named as its reader sees it.

        Every process that opens the state file must agree on the devices: the first one
        initialises it (the node agent on the host, or a container).
        """
        env = {"GPUSHARE_SIM_STATE": state_path, "GPUSHARE_SIM_DEVICES": str(self.devices),
               "GPUSHARE_SIM_MEMORY": str(self.memory_bytes)}
        if self.mig:
            env["GPUSHARE_SIM_MIG"] = self.mig
        return env

    @staticmethod
    def visible(claim: PreparedClaim) -> str:
        """The simulator's stand-in for the claim's device nodes: a container sees only these GPUs,
        numbered from 0 (hook/sim/sim_state.h, sim_visible_count). One variable per claim, so a
        container of two claims sees the GPUs of both."""
        return f"{VISIBLE_ENV_PREFIX}{claim.uid.replace('-', '_')}={','.join(str(g.index) for g in claim.gpus)}"

    def edits(self) -> tuple[list[str], list[Mount]]:
        env = [f"LD_LIBRARY_PATH={CONTAINER_SIM_DIR}",
               *(f"{k}={v}" for k, v in self.env(CONTAINER_SIM_STATE).items())]
        mounts = [Mount(os.path.join(self.host_dir, n), f"{CONTAINER_SIM_DIR}/{n}", _RO) for n in SIM_LIBRARIES]
        mounts.append(Mount(self.state_path, CONTAINER_SIM_STATE, _RW))
        return env, mounts


def build_spec(claim: PreparedClaim, files: ClaimFiles, host_library: str, sim: SimDriver | None = None,
               mps_state_dir: str | None = None, mps_shm: bool = False) -> Spec:
    """`mps_state_dir`: where the GPUs' MPS folders are (mpslayout), for MPS claims; `mps_shm`:
    their daemon's /dev/shm is mounted at /dev/shm too (NVIDIA's daemon from the driver root)."""
    uid = claim.uid
    env = [f"GPUSHARE_CLAIM_UID={uid}", f"{STRATEGY_ENV}={claim.sharing_strategy}"]
    if any(g.mig for g in claim.gpus):  # CUDA opens these MIG devices only (docs/mig.md)
        env.append(f"CUDA_VISIBLE_DEVICES={','.join(g.uuid for g in claim.gpus)}")
    mounts = []
    if claim.injects_library:
        env.append(f"LD_PRELOAD={CONTAINER_LIBRARY}")
        mounts += [Mount(host_library, CONTAINER_LIBRARY, _RO), Mount(files.preload_path(uid), CONTAINER_PRELOAD, _RO),
                   Mount(files.limits_path(uid), CONTAINER_LIMITS, _RO)]
        for i, gpu in enumerate(claim.gpus):
            env += [f"GPUSHARE_MEMORY_LIMIT_{i}={gpu.memory_limit}",
                    f"GPUSHARE_COMPUTE_LIMIT_{i}={gpu.compute_limit}",
                    f"GPUSHARE_DEVICE_UUID_{i}={gpu.uuid}"]
            mounts.append(Mount(files.region_path(uid, i), f"{CONTAINER_REGION_DIR}/{i}", _RW))
            # the agent's rate: trusted by the library because no tenant can write it
            mounts.append(Mount(files.control_path(uid, i), f"{CONTAINER_CONTROL_DIR}/{i}", _RO))
    if claim.sharing_strategy == MPS:
        if mps_state_dir is None:
            raise ValueError("an MPS claim's spec needs the MPS state dir")
        env_mps, mount_mps = mps_edits(claim, mps_state_dir, mps_shm)
        env += env_mps
        mounts += mount_mps
    if sim is not None:
        sim_env, sim_mounts = sim.edits()
        env += [*sim_env, sim.visible(claim)]
        mounts += sim_mounts
    nodes = [DeviceNode(path) for path in claim.device_nodes]
    devices = []
    seen = set()
    for k, device in enumerate(claim.devices):
        name = device.cdi_name(uid)
        if name not in seen:
            seen.add(name)
            devices.append(Device(name, ContainerEdits(env=[f"GPUSHARE_ALLOCATION_{k}={name}"])))
    return Spec(KIND, devices, ContainerEdits(env=env, mounts=mounts, device_nodes=nodes))


def mps_edits(claim: PreparedClaim, state_dir: str, shm: bool = False) -> tuple[list[str], list[Mount]]:
    """The GPU's MPS pipe folder at MPS's default path, and the client's own share and priority
    (a Latency claim's streams NORMAL, a Batch claim's BELOW_NORMAL: the GPU dispatches a request's
    blocks ahead of batch work where their SMs meet).

    The share env vars only let a tenant lower its share: the control daemon's limits for the
    server are the ceiling (kubeletplugin/strategies/mps/control.py sets them), and the library holds the claim's
    processes together to the share in SM-time (hook/src/pacing.c, mps_scale). One GPU per MPS claim: a pipe
    folder names one control daemon, and Prepare refuses MPS claims of several GPUs.

    The pipe folder is read-only (docs/security.md, "MPS: the control daemon"): a client
    connects to the daemon's and its server's sockets, which a read-only mount allows, while a
    tenant can create, replace or link nothing there (no impostor socket, no planted link). The
    plugin's own channel to the daemon (the control folder) and its log are never mounted.
    With `shm`, the daemon's /dev/shm (read-write: an MPS server and its clients share memory
    there) is the containers' /dev/shm, shared by every MPS claim of the GPU (docs/security.md).
    """
    gpu = claim.gpus[0]
    client_priority = mpslayout.PRIORITY_NORMAL if claim.priority == LATENCY else mpslayout.PRIORITY_BELOW_NORMAL
    env = [f"{mpslayout.PIPE_ENV}={mpslayout.CONTAINER_PIPE_DIR}", f"{mpslayout.THREAD_ENV}={gpu.compute_limit}",
           f"{mpslayout.PINNED_ENV}=0={mpslayout.mebibytes(gpu.memory_limit)}",
           f"{mpslayout.PRIORITY_ENV}={client_priority}"]
    mounts = [Mount(mpslayout.pipe_dir(state_dir, gpu.uuid), mpslayout.CONTAINER_PIPE_DIR, _RO)]
    if shm:
        mounts.append(Mount(mpslayout.shm_dir(state_dir, gpu.uuid), "/dev/shm", _RW))
    return env, mounts


def written_by(specs: SpecDir, uid: str, files: ClaimFiles) -> bool:
    """Whether the spec of claim `uid` in `specs` was written by the plugin whose claim folders are
    `files`: it mounts files of them. Another plugin's sharing the CDI root (a playground, a
    test's plugin, another run's: each has its own state dir) names its own. A spec that mounts
    nothing (sharingStrategy None) names no plugin: the caller decides by its checkpoint."""
    ours = os.path.join(files.root, "")
    for ext in (".json", ".yaml"):
        try:
            with open(os.path.join(specs.root, f"{specs.prefix}{uid}{ext}"), encoding="utf-8") as f:
                if ours in f.read():
                    return True
        except OSError:
            continue
    return False
