"""From an allocated ResourceClaim to the limits each of its GPUs gets: a pure function.

Limits per GPU:
- capacity mode (device `gpu-<i>`): the result's `consumedCapacity` (memory bytes, compute
  percent; a missing one means the whole GPU). Several results on one GPU add up.
- partition mode (`gpu-<i>-share-<j>`): k shares of one GPU give k * (memory / N) and
  share_compute(N, k).
Then every GpuShareConfig that applies to one of the GPU's requests lowers them (FromClass
before FromClaim, in order); a config never raises a limit. A config's limits are per GPU.

GPU `i` in the container's view is the claim's i-th distinct GPU, by host GPU index.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from dra_driver import config as gpuconfig
from dra_driver.devicemodel import FULL_COMPUTE, parse_device_name, share_compute, share_memory
from dra_driver.discovery import GpuInfo
from dra_driver.quantity import QuantityError, parse_bytes, show

from .claimref import UID, ClaimError

_SOURCE_ORDER = {"FromClass": 0, "FromClaim": 1}


@dataclass
class GpuLimits:
    """One GPU as a prepared claim's containers see it (position = index in the container)."""

    index: int  # host GPU index
    uuid: str
    minor: int
    memoryLimit: int
    computeLimit: int
    computePolicy: str = "Hard"


@dataclass
class AllocatedDevice:
    """One allocation result of ours: one Device entry of the kubelet's answer."""

    requestNames: list[str]
    poolName: str
    deviceName: str
    shareID: str | None = None
    cdiDeviceIDs: list[str] = field(default_factory=list)

    @property
    def cdi_name_suffix(self) -> str:
        return f"{self.deviceName}-{self.shareID}" if self.shareID else self.deviceName


@dataclass
class Plan:
    gpus: list[GpuLimits]
    devices: list[AllocatedDevice]

    def to_dict(self) -> dict:
        return asdict(self)


def plan_claim(claim: dict, driver: str, pool: str, gpus: dict[int, GpuInfo], partitions: int) -> Plan:
    """The GPUs and limits of `claim` for this node; ClaimError names the bad field and value."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError("status.allocation: the claim is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    ours = [(n, r) for n, r in enumerate(results) if r.get("driver") == driver and r.get("pool") == pool]
    if not ours:
        raise ClaimError(f"status.allocation.devices.results: no device of driver {driver!r} in pool {pool!r}")

    devices: list[AllocatedDevice] = []
    per_gpu: dict[int, dict] = {}  # host index -> {"memory", "compute", "shares", "requests"}
    for n, result in ours:
        where = f"status.allocation.devices.results[{n}]"
        name = result.get("device", "")
        ref = parse_device_name(name) if isinstance(name, str) else None
        if ref is None:
            raise ClaimError(f"{where}.device: not a gpushare device name gpu-<i> or gpu-<i>-share-<j> (got {show(name)})")
        gpu = gpus.get(ref.gpu_index)
        if gpu is None:
            raise ClaimError(f"{where}.device: no GPU with index {ref.gpu_index} on this node (got {show(name)})")
        share_id = result.get("shareID") or None
        if share_id is not None and not (isinstance(share_id, str) and UID.fullmatch(share_id)):
            raise ClaimError(f"{where}.shareID: not a UID (got {show(share_id)})")
        entry = per_gpu.setdefault(gpu.index, {"memory": 0, "compute": 0, "shares": 0, "requests": set()})
        request = result.get("request", "")
        entry["requests"].add(request)
        if ref.share is None:
            memory, compute = _consumed(result.get("consumedCapacity") or {}, gpu, where)
            entry["memory"] += memory
            entry["compute"] += compute
        else:
            entry["shares"] += 1
        devices.append(AllocatedDevice([request], pool, name, share_id))

    configs = _configs(allocation, driver)
    limits = []
    for index in sorted(per_gpu):
        gpu, entry = gpus[index], per_gpu[index]
        memory = entry["memory"] + entry["shares"] * share_memory(gpu, partitions)
        compute = entry["compute"] + (share_compute(partitions, entry["shares"]) if entry["shares"] else 0)
        memory, compute = min(memory, gpu.memory_bytes), min(compute, FULL_COMPUTE)
        policy = "Hard"
        for requests, cfg in configs:
            if not requests or any(_request_matches(r, requests) for r in entry["requests"]):
                memory, compute = cfg.apply(memory, compute)
                policy = cfg.compute_policy
        limits.append(GpuLimits(gpu.index, gpu.uuid, gpu.minor, memory, max(1, compute), policy))
    return Plan(limits, devices)


def _consumed(consumed: dict, gpu: GpuInfo, where: str) -> tuple[int, int]:
    try:
        memory = parse_bytes(consumed.get("memory", gpu.memory_bytes), f"{where}.consumedCapacity.memory")
        compute = parse_bytes(consumed.get("compute", FULL_COMPUTE), f"{where}.consumedCapacity.compute")
    except QuantityError as e:
        raise ClaimError(str(e)) from None
    if memory <= 0:
        raise ClaimError(f"{where}.consumedCapacity.memory: must be greater than zero (got {consumed.get('memory')!r})")
    if not 1 <= compute <= FULL_COMPUTE:
        raise ClaimError(f"{where}.consumedCapacity.compute: must be a percentage from 1 to 100 (got {consumed.get('compute')!r})")
    return memory, compute


def _configs(allocation: dict, driver: str) -> list[tuple[list[str], gpuconfig.GpuShareConfig]]:
    """Our opaque configs, decoded, FromClass before FromClaim (stable within each)."""
    entries = (allocation.get("devices") or {}).get("config") or []
    decoded = []
    for n, entry in enumerate(entries):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue  # another driver's config, or not opaque
        try:
            cfg = gpuconfig.decode(opaque.get("parameters"))
        except gpuconfig.ConfigError as e:
            field_path = f".{e.field}" if e.field else ""
            raise ClaimError(f"status.allocation.devices.config[{n}].opaque.parameters{field_path}: "
                             f"{e.problem} (got {show(e.value)})") from None
        decoded.append((_SOURCE_ORDER.get(entry.get("source"), 1), n, list(entry.get("requests") or []), cfg))
    decoded.sort(key=lambda d: (d[0], d[1]))
    return [(requests, cfg) for _, _, requests, cfg in decoded]


def _request_matches(request: str, requests: list[str]) -> bool:
    """A config for request "r" also applies to its subrequests "r/sub" (firstAvailable)."""
    return request in requests or request.split("/", 1)[0] in requests
