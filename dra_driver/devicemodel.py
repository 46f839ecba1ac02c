"""How a GPU becomes ResourceSlice devices, and back: the one place that builds or parses
device names, and that sizes shares.

The controller publishes devices with these names and capacities; the kubelet plugin reads
an allocation's device names back into (GPU, share) and limits. docs/contract.md fixes the names:
capacity mode publishes `gpu-<index>` (the whole GPU, shared by consumable capacity);
partition mode publishes `gpu-<index>-share-<j>`, each 1/N of the GPU; a GPU the operator
offers as MIG devices publishes one device per MIG profile placement,
`gpu-<index>-mig-<profile>-<start>` (`<profile>` the profile name with `.` and `+` as `-`:
`1g-10gb`, `1g-10gb-me`; `<start>` the first memory slice; docs/mig.md); a prepared device's
CDI device name is `<claimUID>-<device>`, plus `-<shareID>` where the allocation has one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .discovery import GpuInfo

CAPACITY = "capacity"
PARTITION = "partition"
# The order devices are published in, which is the order the scheduler tries them (first fit):
# binpack fills one GPU's shares before the next; spread takes share j of every GPU before any
# GPU's share j+1 (partition mode; docs/controller.md says why capacity mode always packs).
BINPACK = "binpack"
SPREAD = "spread"
DEVICE_ORDERS = (BINPACK, SPREAD)
FULL_COMPUTE = 100  # compute capacity of a whole GPU, in percent
# Capacity mode: memory a request gets when it asks for none (its requestPolicy default), one
# eighth of the GPU's, so a claim that asks only for compute leaves the rest to others. A
# request that asks for no compute holds all of it (compute default: the whole GPU), so nobody
# shares that GPU with it, and the kubelet plugin gives it all the memory too (whole_gpu_memory).
DEFAULT_MEMORY_FRACTION = 8
MEMORY_STEP = 256 * 2**20  # capacity mode's memory step (requestPolicy validRange)

# the parser's bounds, which the builders keep too: a name built here always parses back
MAX_GPU_INDEX = 999_999
MAX_SHARE = 9_999
_DEVICE_NAME = re.compile(  # fullmatch only
    r"gpu-(0|[1-9][0-9]{0,5})(?:-share-(0|[1-9][0-9]{0,3})|-mig-([0-9a-z][0-9a-z-]{0,30}[0-9a-z])-([0-7]))?")


@dataclass(frozen=True)
class DeviceRef:
    """A published device name, parsed."""

    gpu_index: int
    share: int | None  # None: the whole GPU (capacity mode) or a MIG device
    mig_profile: str | None = None  # a MIG device: its profile as the name spells it ("1g-10gb-me")
    mig_start: int | None = None  # and its placement's first memory slice


def mig_slug(profile: str) -> str:
    """A MIG profile name as device names spell it: 1g.10gb+me -> 1g-10gb-me."""
    return profile.replace(".", "-").replace("+", "-")


def mig_device(index: int, profile: str, start: int) -> str:
    return f"gpu-{_in_range('GPU index', index, MAX_GPU_INDEX)}-mig-{mig_slug(profile)}-{_in_range('start', start, 7)}"


def _in_range(what: str, value: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise ValueError(f"{what} must be an integer from 0 to {most} (got {value!r})")
    return value


def whole_gpu_device(index: int) -> str:
    return f"gpu-{_in_range('GPU index', index, MAX_GPU_INDEX)}"


def share_device(index: int, share: int) -> str:
    return f"gpu-{_in_range('GPU index', index, MAX_GPU_INDEX)}-share-{_in_range('share', share, MAX_SHARE)}"


def cdi_device_name(claim_uid: str, device: str, share_id: str | None = None) -> str:
    """The CDI device name of one prepared device: `<claimUID>-<device>[-<shareID>]`."""
    return f"{claim_uid}-{device}-{share_id}" if share_id else f"{claim_uid}-{device}"


def parse_device_name(name: object) -> DeviceRef | None:
    """`gpu-3` -> (3, None); `gpu-3-share-1` -> (3, 1); `gpu-3-mig-3g-40gb-4` -> (3, None, "3g-40gb", 4);
    anything else (any non-string) -> None."""
    m = _DEVICE_NAME.fullmatch(name) if isinstance(name, str) else None
    if not m:
        return None
    return DeviceRef(int(m.group(1)), int(m.group(2)) if m.group(2) is not None else None,
                     m.group(3), int(m.group(4)) if m.group(4) is not None else None)


def share_memory(gpu: GpuInfo, partitions: int) -> int:
    """Bytes of one partition-mode share (whole bytes, rounded down)."""
    return gpu.memory_bytes // partitions


def default_memory(gpu: GpuInfo) -> int:
    """Capacity mode's memory for a request that asks for none: 1/8 of the GPU's, rounded down
    to the 256Mi step, at least one step (80Gi: 10Gi; 24Gi: 3Gi; 141Gi: 17.5Gi)."""
    return max(MEMORY_STEP, gpu.memory_bytes // DEFAULT_MEMORY_FRACTION // MEMORY_STEP * MEMORY_STEP)


def share_compute(partitions: int, shares: int = 1) -> int:
    """Integer percent of `shares` partition-mode shares: at least 1, rounded down."""
    return max(1, FULL_COMPUTE * shares // partitions)
