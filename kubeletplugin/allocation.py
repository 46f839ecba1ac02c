"""From an allocated ResourceClaim to the limits each of its GPUs gets: a pure function.

Limits per GPU:
- capacity mode (device `gpu-<i>`): the result's `consumedCapacity` (memory bytes, compute
  percent; a missing one means the whole GPU). Several results on one GPU add up. A result
  that holds all of the GPU's compute has the GPU alone (every other allocation needs at least
  1 %); when its request asked for no memory (the claim's spec), it gets all the GPU's memory,
  not the requestPolicy default the scheduler booked (1/8: docs/contract.md, ResourceSlices).
- partition mode (`gpu-<i>-share-<j>`): k shares of one GPU give k * (memory / N) and
  share_compute(N, k).
- a MIG device (`gpu-<i>-mig-<profile>-<start>`): a GPU of its own in the container, the
  instance's memory and all its compute (docs/mig.md); its instance is made by Prepare.
Then every GpuShareConfig that applies to one of the GPU's requests lowers them (FromClass
before FromClaim, in order); a config never raises a limit. A config's limits are per GPU.
The sharing strategy is the last one a config chose (a DeviceClass default, a claim's config
overriding it), TimeSlicing if none did; it is one per claim (one CDI spec for all its GPUs).

GPU `i` in the container's view is the claim's i-th distinct GPU, by host GPU index.

unmet_capacity says, for an Event on the claim, which capacity requests partition devices did
not honour.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from dra_driver import config as gpuconfig
from dra_driver.devicemodel import FULL_COMPUTE, mig_slug, parse_device_name, share_compute, share_memory
from dra_driver.discovery import GpuInfo
from dra_driver.mig import MigProfile
from dra_driver.quantity import QuantityError, format_bytes, parse_bytes, show

from .claimref import UID, ClaimError
from .prepared import PreparedDevice, PreparedGpu, PreparedMig

_SOURCE_ORDER = {"FromClass": 0, "FromClaim": 1}
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


@dataclass(frozen=True)
class Plan:
    gpus: tuple[PreparedGpu, ...]
    devices: tuple[PreparedDevice, ...]  # CDI device IDs not chosen yet
    sharing_strategy: str = gpuconfig.TIME_SLICING
    priority: str = gpuconfig.BATCH


def plan_claim(claim: dict[str, Any], driver: str, pool: str, gpus: dict[int, GpuInfo], partitions: int) -> Plan:
    """The GPUs and limits of `claim` for this node; ClaimError names the bad field and value."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError("status.allocation: the claim is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    ours = [(n, r) for n, r in enumerate(results) if r.get("driver") == driver and r.get("pool") == pool]
    if not ours:
        raise ClaimError(f"status.allocation.devices.results: no device of driver {driver!r} in pool {pool!r}")

    devices: list[PreparedDevice] = []
    per_gpu: dict[tuple[int, int], _GpuTotal] = {}  # (GPU index, MIG placement or -1)
    for n, result in ours:
        where = f"status.allocation.devices.results[{n}]"
        name = result.get("device", "")
        ref = parse_device_name(name)
        if ref is None:
            raise ClaimError(f"{where}.device: not a gpushare device name gpu-<i>, gpu-<i>-share-<j> or "
                             f"gpu-<i>-mig-<profile>-<start> (got {show(name)})")
        gpu = gpus.get(ref.gpu_index)
        if gpu is None:
            raise ClaimError(f"{where}.device: no GPU with index {ref.gpu_index} on this node (got {show(name)})")
        share_id = result.get("shareID") or None
        if share_id is not None and not (isinstance(share_id, str) and UID.fullmatch(share_id)):
            raise ClaimError(f"{where}.shareID: not a UID (got {show(share_id)})")
        mig = _mig_profile(gpu, ref.mig_profile, ref.mig_start, where, name)
        entry = per_gpu.setdefault((gpu.index, -1 if ref.mig_start is None else ref.mig_start), _GpuTotal(mig=mig))
        request = result.get("request", "")
        entry.requests.add(request)
        if mig is not None:  # as a whole GPU below, of the instance
            memory, compute = _consumed(result.get("consumedCapacity") or {}, mig.memory_bytes, where)
            if compute == FULL_COMPUTE and not _asks_memory(claim, request, driver):
                memory = mig.memory_bytes
            entry.memory += memory
            entry.compute += compute
        elif ref.share is None:
            memory, compute = _consumed(result.get("consumedCapacity") or {}, gpu.memory_bytes, where)
            if compute == FULL_COMPUTE and not _asks_memory(claim, request, driver):
                memory = gpu.memory_bytes  # the GPU alone: nobody else can use the rest
            entry.memory += memory
            entry.compute += compute
        else:
            entry.shares += 1
        devices.append(PreparedDevice((request,), pool, name, share_id))

    configs = _configs(allocation, driver)
    limits: list[PreparedGpu] = []
    strategies: dict[str, int | None] = {}  # strategy -> the config entry that chose it (None: default)
    priorities: dict[str, int | None] = {}  # priority -> the config entry that chose it (None: default)
    for key in sorted(per_gpu):
        gpu, entry = gpus[key[0]], per_gpu[key]
        memory = entry.memory + entry.shares * share_memory(gpu, partitions)
        compute = entry.compute + (share_compute(partitions, entry.shares) if entry.shares else 0)
        total = entry.mig.memory_bytes if entry.mig else gpu.memory_bytes
        memory, compute = min(memory, total), min(compute, FULL_COMPUTE)
        policy, strategy, chosen_by, limited_by, policy_by = "Hard", gpuconfig.TIME_SLICING, None, None, 0
        priority, priority_by = gpuconfig.BATCH, None
        for n, requests, cfg in configs:
            if not requests or any(_request_matches(r, requests) for r in entry.requests):
                memory, compute = cfg.apply(memory, compute)
                policy, policy_by = cfg.compute_policy, n
                if cfg.sharing_strategy is not None:
                    strategy, chosen_by = cfg.sharing_strategy, n
                if cfg.compute_limit is not None:
                    limited_by = n
                if cfg.priority is not None:
                    priority, priority_by = cfg.priority, n
        _check_merged(strategy, chosen_by, policy, policy_by, limited_by, priority, priority_by)
        strategies.setdefault(strategy, chosen_by)
        priorities.setdefault(priority, priority_by)
        instance = PreparedMig(gpu.uuid, entry.mig.name, entry.mig.profile_id, key[1]) if entry.mig else None
        limits.append(PreparedGpu(gpu.index, gpu.uuid, gpu.minor, memory, max(1, compute), policy, mig=instance))
    if len(strategies) > 1:
        chosen = ", ".join(f"{s} ({_CONFIG.format(n) if n is not None else 'the default'})"
                           for s, n in strategies.items())
        raise ClaimError(f"status.allocation.devices.config: one sharingStrategy per claim: its GPUs got {chosen}")
    strategy = next(iter(strategies), gpuconfig.TIME_SLICING)
    if strategy == gpuconfig.MPS and any(g.mig for g in limits):
        raise ClaimError(f"status.allocation.devices.config: sharingStrategy MPS "
                         f"({_CONFIG.format(strategies[strategy])}) is not offered on MIG devices (docs/mig.md)")
    if strategy == gpuconfig.MPS:  # the library checks an MPS client's SMs against the GPU's
        limits = [replace(g, sm_count=gpus[g.index].sm_count) for g in limits]
    if strategy == gpuconfig.MPS and len(limits) > 1:  # a container reaches one GPU's control daemon
        indexes = ", ".join(str(g.index) for g in limits)
        raise ClaimError(f"status.allocation.devices.results: sharingStrategy MPS "
                         f"({_CONFIG.format(strategies[strategy])}) serves one GPU per claim (got GPUs {indexes})")
    # one priority per claim: its MPS client's priority (Latency needs MPS: one GPU per claim)
    return Plan(tuple(limits), tuple(devices), strategy, next(iter(priorities), gpuconfig.BATCH))


_CONFIG = "status.allocation.devices.config[{}]"


def _check_merged(strategy: str, chosen_by: int | None, policy: str, policy_by: int, limited_by: int | None,
                  priority: str, priority_by: int | None) -> None:
    """Configs that each hold alone may not hold together (a DeviceClass's strategy, a claim's
    Burst or Latency): the same rule the decoder applies to one config, naming both entries."""
    conflict = gpuconfig.strategy_conflict(strategy, policy, limited_by is not None, priority)
    if conflict is None:
        return
    field_name, problem = conflict
    at, value = {"computePolicy": (policy_by, policy), "priority": (priority_by, priority)}.get(
        field_name, (limited_by, "set"))
    source = "by default" if chosen_by is None else f"from {_CONFIG.format(chosen_by)}"
    raise ClaimError(f"{_CONFIG.format(at)}.opaque.parameters.{field_name}: {problem} (got {show(value)}; "
                     f"sharingStrategy {strategy} {source})")


@dataclass
class _GpuTotal:
    """What a claim's results on one GPU add up to."""

    memory: int = 0
    compute: int = 0
    shares: int = 0
    requests: set[str] = field(default_factory=set)
    mig: MigProfile | None = None  # a MIG device's profile


def _mig_profile(gpu: GpuInfo, slug: str | None, start: int | None, where: str, name: str) -> MigProfile | None:
    """The profile of a MIG device name; None for another device; ClaimError when the GPU has no such placement."""
    if slug is None or start is None:
        return None
    for profile in gpu.mig_profiles:
        if mig_slug(profile.name) == slug and start in profile.placements:
            return profile
    why = ("its MIG mode is off" if not gpu.mig_mode
           else f"its profiles are {', '.join(p.name for p in gpu.mig_profiles)}")
    raise ClaimError(f"{where}.device: GPU {gpu.index} has no MIG placement {show(name)} ({why})")


def _consumed(consumed: dict[str, Any], total_memory: int, where: str) -> tuple[int, int]:
    try:
        memory = parse_bytes(consumed.get("memory", total_memory), f"{where}.consumedCapacity.memory")
        compute = parse_bytes(consumed.get("compute", FULL_COMPUTE), f"{where}.consumedCapacity.compute")
    except QuantityError as e:
        raise ClaimError(str(e)) from None
    if memory <= 0:
        raise ClaimError(f"{where}.consumedCapacity.memory: must be greater than zero (got {consumed.get('memory')!r})")
    if not 1 <= compute <= FULL_COMPUTE:
        raise ClaimError(f"{where}.consumedCapacity.compute: must be a percentage from 1 to 100 "
                         f"(got {consumed.get('compute')!r})")
    return memory, compute


def _asks_memory(claim: dict[str, Any], request: str, driver: str) -> bool:
    """Whether the claim's request `request` (`name`, or `name/sub` for a firstAvailable
    subrequest) asks for memory (`memory` or `<driver>/memory`). A request the spec does not
    have (a claim written by someone else) counts as asking: its booked memory stands."""
    name, _, sub = request.partition("/")
    spec = claim.get("spec") or {}
    entry = next((r for r in (spec.get("devices") or {}).get("requests") or []
                  if isinstance(r, dict) and r.get("name") == name), None)
    if entry is None:
        return True
    ask = entry.get("exactly")
    if sub:
        ask = next((s for s in entry.get("firstAvailable") or [] if isinstance(s, dict) and s.get("name") == sub), None)
    if not isinstance(ask, dict):
        return True
    asked = ((ask.get("capacity") or {}).get("requests")) or {}
    return "memory" in asked or f"{driver}/memory" in asked


def _configs(allocation: dict[str, Any], driver: str) -> list[tuple[int, list[str], gpuconfig.GpuShareConfig]]:
    """Our opaque configs with their entry index, decoded, FromClass before FromClaim (stable within each)."""
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
    return [(n, requests, cfg) for _, n, requests, cfg in decoded]


def _request_matches(request: str, requests: list[str]) -> bool:
    """A config for request "r" also applies to its subrequests "r/sub" (firstAvailable)."""
    return request in requests or request.split("/", 1)[0] in requests


def unmet_capacity(claim: dict[str, Any], driver: str, pool: str, gpus: tuple[PreparedGpu, ...]) -> str | None:
    """What to tell the claim's author when requests that asked for capacity got partition
    devices (fixed shares): what they asked, why it was not applied, what they got; else None.

    The ask is in the claim's spec, or, where the API server dropped `capacity` (no
    DRAConsumableCapacity gate), only in the last-applied-configuration `kubectl apply` keeps."""
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    shares: dict[str, list[str]] = {}
    for r in results:
        ref = parse_device_name(r.get("device"))
        if r.get("driver") == driver and r.get("pool") == pool and ref is not None and ref.share is not None:
            shares.setdefault(str(r.get("request", "")), []).append(str(r["device"]))
    stored = _capacity_asks(claim.get("spec"))
    applied = _capacity_asks(_last_applied_spec(claim))
    told = []
    for request, devices in sorted(shares.items()):
        if request in stored:
            asked, why = stored[request], "this node publishes partition devices, fixed shares"
        elif request in applied:
            asked, why = applied[request], "the API server dropped it (feature gate DRAConsumableCapacity off)"
        else:
            continue
        wanted = ", ".join(f"{name}={value}" for name, value in sorted(asked.items()))
        told.append(f"request {request!r} asked for capacity {wanted} but {why}; it got {', '.join(devices)}")
    if not told:
        return None
    limits = ", ".join(f"GPU {g.index}: memory {format_bytes(g.memory_limit)}, compute {g.compute_limit} %"
                       for g in gpus)
    return f"gpushare: {'; '.join(told)} (the claim's limits: {limits})"


def _capacity_asks(spec: Any) -> dict[str, dict[str, Any]]:
    """{request name as allocation results name it ("r", or "r/sub" for firstAvailable): its
    capacity.requests} for the requests of a claim spec that ask for capacity."""
    asks: dict[str, dict[str, Any]] = {}
    requests = ((spec or {}).get("devices") or {}).get("requests") if isinstance(spec, dict) else None
    for request in requests if isinstance(requests, list) else []:
        if not isinstance(request, dict):
            continue
        name = str(request.get("name", ""))
        exactly = request.get("exactly")
        choices = [(name, exactly)] if isinstance(exactly, dict) else [
            (f"{name}/{sub.get('name', '')}", sub) for sub in request.get("firstAvailable") or []
            if isinstance(sub, dict)]
        for key, ask in choices:
            wanted = (ask.get("capacity") or {}).get("requests")
            if isinstance(wanted, dict) and wanted:
                asks[key] = wanted
    return asks


def _last_applied_spec(claim: dict[str, Any]) -> Any:
    """The spec `kubectl apply` sent, as its annotation records it (None without one)."""
    text = ((claim.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    try:
        return (json.loads(text) or {}).get("spec") if isinstance(text, str) else None
    except (ValueError, AttributeError):  # not JSON, or JSON that is no object: no record
        return None
