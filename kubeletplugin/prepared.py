"""A prepared claim: what Prepare decided for one claim on this node, as one frozen value.

Driver._plan builds it; the claim files, the CDI spec, the checkpoint, the gRPC answer and the
node agent read it. Its JSON form is the claim folder's prepared.json and the checkpoint's
`prepared` entries (docs/kubelet-plugin.md); `to_json` writes exactly what earlier releases
wrote, so a node upgrades in place, and `from_json` is the one reader, for both files and the
checkpoint's version 1 entries. Keys it does not know are ignored (a downgrade still reads a
newer file); missing optional keys take the defaults older releases implied. It refuses only
what no release writes: a value Prepare can record (a lost GPU's memory limit of 0, an empty
uuid from a mock GPU file) must read back, or a restart would lose the claim's record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra_driver.config import BATCH, COMPUTE_POLICIES, NONE, PRIORITIES, SHARING_STRATEGIES, TIME_SLICING
from dra_driver.devicemodel import FULL_COMPUTE, cdi_device_name, parse_device_name
from dra_driver.quantity import show

from .claimref import is_name, is_namespace, is_uid

JSON = dict[str, Any]
Check = Callable[[str], bool]


class PreparedError(ValueError):
    """A prepared-claim document that cannot be trusted; the message names the field and value."""


@dataclass(frozen=True)
class PreparedMig:
    """The MIG instance a GPU of the claim is (docs/mig.md): its placement on the parent GPU and,
    once created, its GPU and compute instance IDs."""

    parent_uuid: str
    profile: str  # "3g.40gb"
    profile_id: int  # NVML's GPU-instance profile ID
    start: int  # first memory slice
    gpu_instance: int = 0  # 0: not created yet
    compute_instance: int = 0

    def to_json(self) -> JSON:
        return {"parentUUID": self.parent_uuid, "profile": self.profile, "profileID": self.profile_id,
                "start": self.start, "gpuInstance": self.gpu_instance, "computeInstance": self.compute_instance}


@dataclass(frozen=True)
class PreparedGpu:
    """One GPU as the claim's containers see it (its position = its index in the container).
    A MIG device is one too: `uuid` is then the MIG device's, `index` and `minor` its parent's."""

    index: int  # host GPU index
    uuid: str
    minor: int  # /dev/nvidia<minor>
    memory_limit: int  # bytes
    compute_limit: int  # percent, 1..100
    compute_policy: str = "Hard"  # COMPUTE_POLICIES
    sm_count: int = 0  # the GPU's SMs, recorded for MPS claims only (the library checks MPS clients against it)
    mig: PreparedMig | None = None  # a MIG device: its instance

    @property
    def key(self) -> tuple[int, int | None]:
        """What tells the claim's GPUs apart: the host GPU, and the placement of a MIG device on it."""
        return self.index, self.mig.start if self.mig else None

    def to_json(self) -> JSON:
        doc: JSON = {"index": self.index, "uuid": self.uuid, "minor": self.minor, "memoryLimit": self.memory_limit,
                     "computeLimit": self.compute_limit, "computePolicy": self.compute_policy}
        if self.sm_count:  # absent before MPS claims carried it: earlier releases read the rest unchanged
            doc["smCount"] = self.sm_count
        if self.mig:
            doc["mig"] = self.mig.to_json()
        return doc


@dataclass(frozen=True)
class PreparedDevice:
    """One allocation result of ours: one Device entry of the kubelet's answer."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str  # the ResourceSlice device: gpu-<i> or gpu-<i>-share-<j>
    share_id: str | None = None
    cdi_device_ids: tuple[str, ...] = ()

    @property
    def gpu_index(self) -> int:
        return self.gpu_key[0]

    @property
    def gpu_key(self) -> tuple[int, int | None]:
        """The PreparedGpu.key of the GPU it is on."""
        ref = parse_device_name(self.device_name)
        if ref is None:  # the model is built from parsed names only
            raise PreparedError(f"deviceName: not a gpushare device name (got {show(self.device_name)})")
        return ref.gpu_index, ref.mig_start

    def cdi_name(self, claim_uid: str) -> str:
        return cdi_device_name(claim_uid, self.device_name, self.share_id)

    def to_json(self) -> JSON:
        return {"requestNames": list(self.request_names), "poolName": self.pool_name, "deviceName": self.device_name,
                "shareID": self.share_id, "cdiDeviceIDs": list(self.cdi_device_ids)}


@dataclass(frozen=True)
class PreparedClaim:
    namespace: str
    name: str
    uid: str
    gpus: tuple[PreparedGpu, ...]
    devices: tuple[PreparedDevice, ...]
    device_nodes: tuple[str, ...] = ()  # written by us where no NVIDIA toolkit spec is found
    library: str | None = None  # the libgpushare.so build it was prepared with (None: older release)
    sharing_strategy: str = TIME_SLICING  # SHARING_STRATEGIES (docs/strategies.md)
    priority: str = BATCH  # PRIORITIES: Latency only under MPS (its client's MPS priority)

    @property
    def injects_library(self) -> bool:
        """Whether its containers get libgpushare.so, the limits file and regions (not under None)."""
        return self.sharing_strategy != NONE

    def gpu_of(self, device: PreparedDevice) -> PreparedGpu:
        """The GPU a device of this claim is on."""
        return next(g for g in self.gpus if g.key == device.gpu_key)

    def to_json(self) -> JSON:
        doc: JSON = {"namespace": self.namespace, "name": self.name, "uid": self.uid,
                     "gpus": [g.to_json() for g in self.gpus], "devices": [d.to_json() for d in self.devices]}
        if self.library is not None:
            doc["library"] = self.library
        doc["deviceNodes"] = list(self.device_nodes)
        if self.sharing_strategy != TIME_SLICING:  # TimeSlicing claims read back by earlier releases unchanged
            doc["sharingStrategy"] = self.sharing_strategy
        if self.priority != BATCH:  # likewise: absent before claims could serve requests
            doc["priority"] = self.priority
        return doc

    @classmethod
    def from_json(cls, doc: object, where: str = "prepared") -> PreparedClaim:
        """The claim a JSON document describes; PreparedError names the first bad field and its value."""
        d = _Fields(doc, where)
        uid = d.text("uid", is_uid, "a UID")
        namespace = d.text("namespace", is_namespace, "a DNS label")
        name = d.text("name", is_name, "a DNS subdomain")
        gpus = tuple(_gpu(g) for g in d.objects("gpus"))
        keys = [g.key for g in gpus]
        if len(set(keys)) != len(keys):
            raise PreparedError(f"{where}.gpus: a GPU index appears twice (got {show([g.index for g in gpus])})")
        devices = tuple(_device(x, set(keys)) for x in d.objects("devices"))
        nodes = d.strings("deviceNodes", lambda v: v.startswith("/dev/"), "a path under /dev/", optional=True)
        library = d.optional_text("library", lambda v: v.startswith("/"), "an absolute path")
        strategy = d.optional_text("sharingStrategy", lambda v: v in SHARING_STRATEGIES, ", ".join(SHARING_STRATEGIES))
        priority = d.optional_text("priority", lambda v: v in PRIORITIES, " or ".join(PRIORITIES))
        return cls(namespace, name, uid, gpus, devices, nodes, library, strategy or TIME_SLICING, priority or BATCH)


def _gpu(d: _Fields) -> PreparedGpu:
    policy = d.optional_text("computePolicy", lambda v: v in COMPUTE_POLICIES, " or ".join(COMPUTE_POLICIES))
    return PreparedGpu(index=d.integer("index", 0), uuid=d.text("uuid", _any, "a string"),
                       minor=d.integer("minor", 0), memory_limit=d.integer("memoryLimit", 0),
                       compute_limit=d.integer("computeLimit", 1, FULL_COMPUTE), compute_policy=policy or "Hard",
                       sm_count=d.integer("smCount", 0, optional=True), mig=_mig(d))


def _mig(gpu: _Fields) -> PreparedMig | None:
    if gpu.doc.get("mig") is None:
        return None
    d = _Fields(gpu.doc["mig"], f"{gpu.where}.mig")
    return PreparedMig(parent_uuid=d.text("parentUUID", _any, "a string"), profile=d.text("profile", _any, "a string"),
                       profile_id=d.integer("profileID", 0), start=d.integer("start", 0, 7),
                       gpu_instance=d.integer("gpuInstance", 0), compute_instance=d.integer("computeInstance", 0))


def _device(d: _Fields, gpus: set[tuple[int, int | None]]) -> PreparedDevice:
    device = d.text("deviceName", lambda v: parse_device_name(v) is not None,
                    "gpu-<i>, gpu-<i>-share-<j> or gpu-<i>-mig-<profile>-<start>")
    ref = parse_device_name(device)
    if ref is None or (ref.gpu_index, ref.mig_start) not in gpus:
        raise PreparedError(f"{d.where}.deviceName: names a GPU the claim's gpus lack (got {show(device)})")
    return PreparedDevice(request_names=d.strings("requestNames", _any, "a string"),
                          pool_name=d.text("poolName", _any, "a string"), device_name=device,
                          share_id=d.optional_text("shareID", is_uid, "a UID"),
                          cdi_device_ids=d.strings("cdiDeviceIDs", lambda v: "=" in v, "a CDI device ID"))


def _any(_: str) -> bool:
    return True


class _Fields:
    """Typed reads of one JSON object's fields, each refusal naming `<where>.<field>` and the value."""

    def __init__(self, doc: object, where: str):
        if not isinstance(doc, dict):
            raise PreparedError(f"{where}: expected an object (got {show(doc)})")
        self.doc: JSON = doc
        self.where = where

    def _required(self, key: str) -> object:
        if key not in self.doc:
            raise PreparedError(f"{self.where}.{key}: missing")
        return self.doc[key]

    def text(self, key: str, ok: Check, what: str) -> str:
        self._required(key)
        value = self.optional_text(key, ok, what)
        if value is None:
            raise PreparedError(f"{self.where}.{key}: expected {what} (got None)")
        return value

    def optional_text(self, key: str, ok: Check, what: str) -> str | None:
        value = self.doc.get(key)
        if value is not None and (not isinstance(value, str) or not ok(value)):
            raise PreparedError(f"{self.where}.{key}: expected {what} (got {show(value)})")
        return value

    def integer(self, key: str, low: int, high: int | None = None, optional: bool = False) -> int:
        """`optional`: a missing or null key reads as `low`."""
        if optional and self.doc.get(key) is None:
            return low
        value = self._required(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise PreparedError(f"{self.where}.{key}: expected an integer {span} (got {show(value)})")
        return value

    def strings(self, key: str, ok: Check, what: str, optional: bool = False) -> tuple[str, ...]:
        items = [] if optional and self.doc.get(key) is None else self._list(key)
        for i, v in enumerate(items):
            if not isinstance(v, str) or not ok(v):
                raise PreparedError(f"{self.where}.{key}[{i}]: expected {what} (got {show(v)})")
        return tuple(str(v) for v in items)

    def objects(self, key: str) -> list[_Fields]:
        items = self._list(key)
        if not items:
            raise PreparedError(f"{self.where}.{key}: expected at least one entry (got [])")
        return [_Fields(v, f"{self.where}.{key}[{i}]") for i, v in enumerate(items)]

    def _list(self, key: str) -> list[object]:
        value = self._required(key)
        if not isinstance(value, list):
            raise PreparedError(f"{self.where}.{key}: expected a list (got {show(value)})")
        return value
