"""Desired ResourceSlices for one node: pure functions from GPUs to slice objects.

Everything here is plain data in, plain dicts out (the JSON the API server speaks), so the
shapes fixed by docs/contract.md can be tested without a server. The reconciler decides *when*
to publish; this module decides *what*.
"""

from __future__ import annotations

import hashlib
import re
from decimal import Decimal
from typing import Any

from .. import devicemodel
from ..config.strategies import STRATEGY_ATTRIBUTE, GpuStrategies
from ..devicemodel import BINPACK, CAPACITY, DEVICE_ORDERS, FULL_COMPUTE, MEMORY_STEP, PARTITION, SPREAD
from ..discovery import GpuInfo
from ..kube import JSON
from ..mig import NO_MIG, GpuSet, MigProfile
from ..quantity import QuantityError, format_bytes, parse_decimal

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128  # per slice (API validation)
MAX_DEVICES_WITH_TAINTS = 64  # per slice when any device in it has taints
TAINT_KEY = "gpushare.dev/unhealthy"
TAINT_EFFECT = "NoSchedule"

# Capacity-mode request policy. Claims ask for memory in 256Mi steps and compute in whole
# percent. What a request gets of a capacity it does not name is the policy's default:
# - compute: the whole GPU (100). A request that asks for no compute (nothing at all, or only
#   memory) holds all of the GPU's time, so no other claim shares that GPU: a plain "give me a
#   gpushare device" behaves like ordinary DRA (one exclusive GPU). The kubelet plugin gives
#   such a request all the GPU's memory when it asked for none (kubeletplugin/allocation.py).
# - memory: 1/8 of the GPU (devicemodel.default_memory, 10Gi of 80Gi). A request that asks
#   only for compute leaves the rest of the memory to others (it would take all of it with a
#   whole-GPU default: one `compute: "10"` claim blocked every other claim on its GPU).
# The admission policy gpushare.dev-requests-warnings tells the author of either at apply time.
MIN_PUBLISHABLE_MEMORY = 2 * MEMORY_STEP  # validRange needs min + step <= capacity


def semver(text: str) -> str:
    """A semver 2.0 version from a dotted version: "9.0" -> "9.0.0", "580.65.06" -> "580.65.6"."""
    parts = re.findall(r"\d+", text.split("-")[0].split("+")[0])[:3]
    numbers = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(numbers)


def taint_value(reason: str) -> str:
    """A short label value (<= 63 chars, [A-Za-z0-9-_.], alphanumeric ends) from a health reason."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", reason)[:63]
    value = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)
    return value or "Unhealthy"


def quantity(value: Decimal | int) -> str:
    """A canonical quantity string: whole numbers plain, fractions in milli-units (12.5 -> 12500m)."""
    value = Decimal(value)
    if value == value.to_integral_value():
        return str(int(value))
    return f"{int(value * 1000)}m"


# Standard attribute names of k8s.io/dynamic-resource-allocation/deviceattribute: the same on
# every driver, so a constraint `matchAttribute: resource.kubernetes.io/pcieRoot` can align a
# GPU with another driver's NIC.
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"


def _attributes(gpu: GpuInfo, mode: str, strategy: str) -> JSON:
    """NVIDIA's DRA driver's names and types (cmd/gpu-kubelet-plugin/deviceinfo.go), so its
    selectors carry over, plus gpushare's `index`, `sharing` and `sharingStrategy` (what the GPU
    serves: TimeSlicing, MPS or Mixed, dra_driver/config/strategies.py): at most 14 of the 32
    attributes and capacities a device may have."""
    attributes: JSON = {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid[:64]},
        "index": {"int": gpu.index},
        "productName": {"string": gpu.product_name[:64]},
        "architecture": {"string": gpu.architecture[:64]},
        "cudaComputeCapability": {"version": semver(gpu.cuda_compute_capability)},
        "driverVersion": {"version": semver(gpu.driver_version)},
        "cudaDriverVersion": {"version": semver(gpu.cuda_driver_version)},
        "sharing": {"string": mode},
        STRATEGY_ATTRIBUTE: {"string": strategy},
    }
    if gpu.brand:
        attributes["brand"] = {"string": gpu.brand[:64]}
    if gpu.pci_bus_id:
        attributes["pcieBusID"] = {"string": gpu.pci_bus_id}  # NVIDIA's name up to v25.12
        attributes[PCI_BUS_ID_ATTRIBUTE] = {"string": gpu.pci_bus_id}  # and from v0.4
    if gpu.pcie_root:
        attributes[PCIE_ROOT_ATTRIBUTE] = {"string": gpu.pcie_root[:64]}
    return attributes


def _capacity_device(gpu: GpuInfo, strategy: str) -> JSON:
    max_memory = gpu.memory_bytes // MEMORY_STEP * MEMORY_STEP  # max must be a multiple of step
    return {
        "name": devicemodel.whole_gpu_device(gpu.index),
        "allowMultipleAllocations": True,
        "attributes": _attributes(gpu, CAPACITY, strategy),
        "capacity": {
            "memory": {
                "value": format_bytes(gpu.memory_bytes),
                "requestPolicy": {
                    "default": format_bytes(devicemodel.default_memory(gpu)),
                    "validRange": {"min": format_bytes(MEMORY_STEP), "step": format_bytes(MEMORY_STEP),
                                   "max": format_bytes(max_memory)},
                },
            },
            "compute": {
                "value": str(FULL_COMPUTE),
                "requestPolicy": {
                    "default": str(FULL_COMPUTE),
                    "validRange": {"min": "1", "step": "1", "max": str(FULL_COMPUTE)},
                },
            },
        },
    }


def _share_devices(gpu: GpuInfo, partitions: int, strategy: str) -> list[JSON]:
    memory = format_bytes(devicemodel.share_memory(gpu, partitions))
    compute = quantity(Decimal(FULL_COMPUTE) / partitions)
    return [{"name": devicemodel.share_device(gpu.index, j), "attributes": _attributes(gpu, PARTITION, strategy),
             "capacity": {"memory": {"value": memory}, "compute": {"value": compute}}}
            for j in range(partitions)]


# --- MIG: one device per profile placement, sharing the GPU's counters (KEP 4815; docs/mig.md) ----
MIG_TYPE = "mig"
MAX_COUNTER_SETS = 8  # per slice (API validation)


def mig_counter_set(gpu: GpuInfo) -> str:
    return f"gpu-{gpu.index}-mig"


def offers_mig(gpu: GpuInfo, mig_gpus: GpuSet) -> bool:
    """A GPU published as MIG devices: in MIG mode (the operator's) and chosen by --mig-gpus."""
    return gpu.mig_mode and gpu.index in mig_gpus and bool(gpu.mig_profiles)


def mig_note(gpu: GpuInfo, mig_gpus: GpuSet) -> str | None:
    """What the operator should know about a GPU's MIG devices, for the plugin's log; None when
    --mig-gpus does not name it (nothing was asked)."""
    if gpu.index not in mig_gpus:
        return None
    if not gpu.mig_mode:
        return (f"GPU {gpu.index} ({gpu.uuid}) is named by --mig-gpus but its MIG mode is disabled: no MIG devices, "
                f"offered as before; the driver never switches it (nvidia-smi -i {gpu.index} -mig 1 and a GPU reset "
                "enable it)")
    if not gpu.mig_profiles:
        return f"GPU {gpu.index} ({gpu.uuid}) is in MIG mode but NVML lists no MIG profiles: no MIG devices"
    return f"GPU {gpu.index} ({gpu.uuid}) offered as MIG devices: {', '.join(p.name for p in gpu.mig_profiles)}"


def _whole_profile(profiles: tuple[MigProfile, ...]) -> MigProfile:
    return max(profiles, key=lambda p: (p.compute_slices, p.size, p.multiprocessors))


def _mig_counters(profile: MigProfile, start: int) -> dict[str, int]:
    """What one placement takes of its GPU: its memory slices, its compute slices (the first
    `compute_slices` from its start: NVIDIA's placements never cross), its multiprocessors and engines."""
    counters = {f"memory-slice-{k}": 1 for k in profile.memory_slices(start)}
    counters.update({f"compute-slice-{k}": 1 for k in range(start, start + profile.compute_slices)})
    for name, value in (("multiprocessors", profile.multiprocessors), ("copy-engines", profile.copy_engines),
                        ("decoders", profile.decoders), ("encoders", profile.encoders),
                        ("jpeg-engines", profile.jpeg_engines), ("ofa-engines", profile.ofa_engines)):
        if value:
            counters[name] = value
    return counters


def mig_counter_sets(gpus: list[GpuInfo], mig_gpus: GpuSet) -> list[JSON]:
    """Each MIG GPU's counters: every memory and compute slice once, and the whole GPU's
    multiprocessors and engines (those of its largest profile, which spans it)."""
    sets = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        if not offers_mig(gpu, mig_gpus) or not publishable(gpu):
            continue
        whole = _whole_profile(gpu.mig_profiles)
        total = {**{f"memory-slice-{k}": 1 for k in range(max(p.placements[-1] + p.size for p in gpu.mig_profiles
                                                              if p.placements))},
                 **_mig_counters(whole, 0)}
        counters = {k: {"value": str(v)} for k, v in sorted(total.items())}
        sets.append({"name": mig_counter_set(gpu), "counters": counters})
    return sets


def _mig_placements(profile: MigProfile) -> tuple[int, ...]:
    """The order the scheduler should try a profile's placements in (first fit): small profiles
    from the top of the GPU down, large ones from the bottom up, so small instances do not split
    the halves that 3g and 4g instances need."""
    return tuple(sorted(profile.placements, reverse=profile.size < 4))


def _mig_capacity(profile: MigProfile, mode: str) -> JSON:
    """A MIG device's memory and compute. Capacity mode: shared like a whole GPU (claims ask for
    slices of the instance, each held to it by the library; a claim that asks for none takes it
    whole: compute defaults to all of it); partition mode: one claim takes the instance."""
    memory = format_bytes(profile.memory_bytes)
    if mode != CAPACITY:
        return {"memory": {"value": memory}, "compute": {"value": str(FULL_COMPUTE)}}
    top = format_bytes(profile.memory_bytes // MEMORY_STEP * MEMORY_STEP)
    return {
        "memory": {"value": memory, "requestPolicy": {
            "default": top, "validRange": {"min": format_bytes(MEMORY_STEP), "step": format_bytes(MEMORY_STEP),
                                           "max": top}}},
        "compute": {"value": str(FULL_COMPUTE), "requestPolicy": {
            "default": str(FULL_COMPUTE), "validRange": {"min": "1", "step": "1", "max": str(FULL_COMPUTE)}}},
    }


def _mig_devices(gpu: GpuInfo, mode: str) -> list[JSON]:
    common: JSON = {k: v for k, v in _attributes(gpu, "", "").items()
                    if k not in ("uuid", STRATEGY_ATTRIBUTE)}
    common["type"] = {"string": MIG_TYPE}
    common["sharing"] = {"string": MIG_TYPE}  # extended-resource classes select on it: every device has one
    common["parentUUID"] = {"string": gpu.uuid[:64]}
    devices = []
    for profile in sorted(gpu.mig_profiles, key=lambda p: (p.compute_slices, p.memory_bytes, p.name)):
        for start in _mig_placements(profile):
            attributes = {**common, "profile": {"string": profile.name},
                          "placementStart": {"int": start}, "multiprocessors": {"int": profile.multiprocessors}}
            device: JSON = {"name": devicemodel.mig_device(gpu.index, profile.name, start)}
            if mode == CAPACITY:
                device["allowMultipleAllocations"] = True
            devices.append({
                **device,
                "attributes": attributes,
                "capacity": _mig_capacity(profile, mode),
                "consumesCounters": [{"counterSet": mig_counter_set(gpu), "counters": {
                    k: {"value": str(v)} for k, v in sorted(_mig_counters(profile, start).items())}}],
            })
    return devices


def publishable(gpu: GpuInfo) -> bool:
    """A GPU we can describe: one whose memory NVML could read (a lost GPU reports 0)."""
    return gpu.memory_bytes >= MIN_PUBLISHABLE_MEMORY


def desired_devices(gpus: list[GpuInfo], mode: str, partitions: int, taints: bool,
                    effect: str = TAINT_EFFECT, order: str = BINPACK,
                    strategies: GpuStrategies | None = None, mig_gpus: GpuSet = NO_MIG) -> list[JSON]:
    """The devices of a node in the order the scheduler should try them: by GPU index then
    share (binpack), or by share then GPU index (spread; the same as binpack in capacity mode,
    one device per GPU). The scheduler tries a node's devices by slice name, then in slice
    order, and takes the first that fits (kubernetes PR 136641, 1.36).

    An unhealthy GPU is published with a taint when the server keeps device taints (NoSchedule:
    new claims avoid it; NoExecute: also evicts the pods using it; the scheduler and operators
    can see why), else left out.

    A GPU in MIG mode is published as its MIG profile placements when --mig-gpus names it, else
    not at all: CUDA cannot use a GPU in MIG mode outside its instances (docs/mig.md).
    """
    if order not in DEVICE_ORDERS:
        raise ValueError(f"order: {order!r} is not one of {', '.join(DEVICE_ORDERS)}")
    per_gpu = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        if not publishable(gpu) or (not gpu.healthy and not taints):
            continue
        if gpu.mig_mode and not offers_mig(gpu, mig_gpus):
            continue
        strategy = (strategies or GpuStrategies()).of(gpu.index)
        if gpu.mig_mode:
            gpu_devices = _mig_devices(gpu, mode)
        elif mode == CAPACITY:
            gpu_devices = [_capacity_device(gpu, strategy)]
        else:
            gpu_devices = _share_devices(gpu, partitions, strategy)
        if not gpu.healthy:
            taint = {"key": TAINT_KEY, "value": taint_value(gpu.health_reason), "effect": effect}
            gpu_devices = [{**d, "taints": [taint]} for d in gpu_devices]
        per_gpu.append(gpu_devices)
    if order == SPREAD and mode == PARTITION:  # share 0 of every GPU, then share 1 of every GPU, ...
        shared = [g for g in per_gpu if not g[0].get("consumesCounters")]
        spread = [d for shares in zip(*shared, strict=True) for d in shares]
        return spread + [d for g in per_gpu if g[0].get("consumesCounters") for d in g]
    return [d for gpu_devices in per_gpu for d in gpu_devices]


def chunk_devices(devices: list[JSON]) -> list[list[JSON]]:
    """Devices split into slices of at most 128 (64 when any device has taints or consumes counters).

    One limit for the whole pool keeps the split stable and simple; a pool always has at
    least one slice, empty when there are no devices, so consumers see the pool exists.
    """
    size = (MAX_DEVICES_WITH_TAINTS if any(d.get("taints") or d.get("consumesCounters") for d in devices)
            else MAX_DEVICES)
    return [devices[i:i + size] for i in range(0, len(devices), size)] or [[]]


def slice_name(node: str, driver: str, suffix: int | str) -> str:
    """`<node>-<driver>-<suffix>`; shortened with a hash when that would pass 253 characters.

    Deterministic names make a lost create response harmless (the retry gets 409, never a
    duplicate slice) and let a restarted controller find its slices by name.
    """
    name = f"{node}-{driver}-{suffix}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(f"{node}/{driver}".encode()).hexdigest()[:10]
    return f"{node[:200].rstrip('.-')}-{digest}-{suffix}"


def owner_reference(node: str, node_uid: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}


def desired_slices(node: str, driver: str, devices: list[JSON], node_uid: str | None,
                   counter_sets: list[JSON] | None = None) -> list[JSON]:
    """The slices of the pool, generation 0: the reconciler sets the real generation. Counter
    sets (MIG GPUs) go in slices of their own, `<node>-<driver>-counters-<i>`, as the API wants
    (a slice holds sharedCounters or devices, not both)."""
    chunks = chunk_devices(devices)
    sets = counter_sets or []
    counter_chunks = [sets[i:i + MAX_COUNTER_SETS] for i in range(0, len(sets), MAX_COUNTER_SETS)]
    count = len(chunks) + len(counter_chunks)
    slices = []
    parts: list[tuple[int | str, str, list[JSON]]] = [(i, "devices", c) for i, c in enumerate(chunks)]
    parts += [(f"counters-{i}", "sharedCounters", c) for i, c in enumerate(counter_chunks)]
    for suffix, key, chunk in parts:
        metadata: JSON = {"name": slice_name(node, driver, suffix)}
        if node_uid:
            metadata["ownerReferences"] = [owner_reference(node, node_uid)]
        slices.append({
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": metadata,
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 0, "resourceSliceCount": count},
                key: chunk,
            },
        })
    return slices


def with_generation(slice_obj: JSON, generation: int) -> JSON:
    spec = slice_obj["spec"]
    return {**slice_obj, "spec": {**spec, "pool": {**spec["pool"], "generation": generation}}}


# --- comparing what we want with what the server has ------------------------------------

def _canonical_quantities(value: Any) -> Any:
    """Quantity strings parsed, so "12.5" equals "12500m" and "16Gi" equals "17179869184"."""
    if isinstance(value, list):
        return [_canonical_quantities(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical_quantities(v) for k, v in value.items()}
    if isinstance(value, str):
        try:
            return parse_decimal(value, "quantity")
        except QuantityError:
            return value
    return value


def _canonical_device(device: JSON) -> JSON:
    device = dict(device)
    for key in ("capacity", "consumesCounters"):
        if key in device:
            device[key] = _canonical_quantities(device[key])
    if device.get("taints"):  # timeAdded is set by the server
        device["taints"] = sorted(({k: v for k, v in t.items() if k != "timeAdded"} for t in device["taints"]),
                                  key=lambda t: (t["key"], t.get("value", ""), t["effect"]))
    else:
        device.pop("taints", None)
    if not device.get("allowMultipleAllocations"):
        device.pop("allowMultipleAllocations", None)
    return device


def content(slice_obj: JSON) -> JSON:
    """What we manage in a slice, without server-set fields, the generation and list order."""
    spec = slice_obj.get("spec") or {}
    pool = spec.get("pool") or {}
    owners = (slice_obj.get("metadata") or {}).get("ownerReferences") or []
    return {
        "owners": sorted((o.get("kind"), o.get("name"), o.get("uid"), bool(o.get("controller"))) for o in owners),
        "driver": spec.get("driver"),
        "nodeName": spec.get("nodeName"),
        "pool": (pool.get("name"), pool.get("resourceSliceCount")),
        "devices": sorted((_canonical_device(d) for d in spec.get("devices") or []), key=lambda d: d["name"]),
        "sharedCounters": sorted((_canonical_quantities(c) for c in spec.get("sharedCounters") or []),
                                 key=lambda c: str(c.get("name"))),
        "other": sorted(k for k in spec if k not in ("driver", "nodeName", "pool", "devices", "sharedCounters")),
    }


def generation(slice_obj: JSON) -> int:
    return int(((slice_obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def in_sync(desired: list[JSON], actual: list[JSON]) -> bool:
    """True when the server's slices are exactly the desired ones at one common generation."""
    by_name = {s["metadata"]["name"]: s for s in actual}
    if set(by_name) != {s["metadata"]["name"] for s in desired}:
        return False
    if len({generation(s) for s in actual}) > 1:
        return False
    return all(content(by_name[s["metadata"]["name"]]) == content(s) for s in desired)


# --- what the server keeps -----------------------------------------------------------------

def probe_slice(node: str, driver: str) -> JSON:
    """A one-device slice using every gated field, for a dryRun create that shows what the server keeps."""
    gpu = GpuInfo(index=0, uuid="probe", minor=0, product_name="probe", memory_bytes=2 * MIN_PUBLISHABLE_MEMORY,
                  architecture="probe", cuda_compute_capability="0.0", driver_version="0.0.0",
                  cuda_driver_version="0.0", healthy=False, health_reason="probe")
    obj = desired_slices(node, driver, desired_devices([gpu], CAPACITY, 1, taints=True), None)[0]
    obj["metadata"]["name"] = slice_name(node, driver, "probe")
    return with_generation(obj, 1)


def kept_features(sent: JSON, returned: JSON) -> tuple[bool | None, bool | None]:
    """(consumable capacity kept, device taints kept) judged from a write and the server's answer.

    None where the sent object did not use that feature, so nothing can be concluded.
    """
    sent_devices = (sent.get("spec") or {}).get("devices") or []
    got = {d.get("name"): d for d in (returned.get("spec") or {}).get("devices") or []}
    capacity = taints = None
    for d in sent_devices:
        back = got.get(d["name"], {})
        if d.get("allowMultipleAllocations"):
            capacity = (capacity is not False) and bool(back.get("allowMultipleAllocations"))
        if d.get("taints"):
            taints = (taints is not False) and bool(back.get("taints"))
    return capacity, taints


def counters_kept(sent: JSON, returned: JSON) -> bool:
    """Whether the server kept the partitionable-devices fields (KEP 4815) of a write: a counters
    slice's sharedCounters, its devices' consumesCounters. True when the write had none."""
    spec, back = sent.get("spec") or {}, returned.get("spec") or {}
    if spec.get("sharedCounters") and not back.get("sharedCounters"):
        return False
    got = {d.get("name"): d for d in back.get("devices") or []}
    return all(got.get(d["name"], {}).get("consumesCounters") for d in spec.get("devices") or []
               if d.get("consumesCounters"))
