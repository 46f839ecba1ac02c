"""The CDI spec of one prepared claim.

Design: everything a container needs from the claim (env for all its GPUs, limits file,
regions, library, ld.so.preload, device nodes) is in the *spec-level* containerEdits,
which a runtime applies once per container that gets any device of the spec. A container
holds one gpushare claim, and it may be given several of the claim's device IDs (one per
request it uses) without getting duplicate mounts. Each device entry only sets an
informational `GPUSHARE_ALLOCATION_<k>` (CDI rejects devices without edits).
"""

from __future__ import annotations

from cdi import ContainerEdits, Device, DeviceNode, Mount, Spec

from .claimfiles import CONTAINER_LIBRARY, ClaimFiles

KIND = "k8s.gpushare.dev/claim"
CONTAINER_LIMITS = "/var/run/gpushare/limits"
CONTAINER_REGION_DIR = "/var/run/gpushare/region"
CONTAINER_PRELOAD = "/etc/ld.so.preload"

_RO = ["ro", "nosuid", "nodev", "bind"]
_RW = ["rw", "nosuid", "nodev", "bind"]


def device_name(uid: str, device: dict) -> str:
    """`<claimUID>-<device>` plus `-<shareID>` when the allocation has one (CONTRACT)."""
    suffix = f"{device['deviceName']}-{device['shareID']}" if device.get("shareID") else device["deviceName"]
    return f"{uid}-{suffix}"


def build_spec(uid: str, prepared: dict, files: ClaimFiles, host_library: str) -> Spec:
    gpus = prepared["gpus"]
    env = [f"GPUSHARE_CLAIM_UID={uid}", f"LD_PRELOAD={CONTAINER_LIBRARY}"]
    mounts = [
        Mount(host_library, CONTAINER_LIBRARY, _RO),
        Mount(files.preload_path(uid), CONTAINER_PRELOAD, _RO),
        Mount(files.limits_path(uid), CONTAINER_LIMITS, _RO),
    ]
    for i, gpu in enumerate(gpus):
        env += [f"GPUSHARE_MEMORY_LIMIT_{i}={gpu['memoryLimit']}", f"GPUSHARE_COMPUTE_LIMIT_{i}={gpu['computeLimit']}",
                f"GPUSHARE_DEVICE_UUID_{i}={gpu['uuid']}"]
        mounts.append(Mount(files.region_path(uid, i), f"{CONTAINER_REGION_DIR}/{i}", _RW))
    nodes = [DeviceNode(path) for path in prepared.get("deviceNodes") or []]
    devices = []
    seen = set()
    for k, device in enumerate(prepared["devices"]):
        name = device_name(uid, device)
        if name not in seen:
            seen.add(name)
            devices.append(Device(name, ContainerEdits(env=[f"GPUSHARE_ALLOCATION_{k}={name}"])))
    return Spec(KIND, devices, ContainerEdits(env=env, mounts=mounts, device_nodes=nodes))
