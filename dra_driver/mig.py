"""MIG through NVML: what a GPU in MIG mode offers, and its instances made and destroyed.

The same calls on a real GPU and on the simulated NVML (hook/sim/sim_mig.c, which follows
NVIDIA's tables for the H100 80GB and A100 80GB; docs/mig.md). The driver only reads a GPU's MIG
mode: the operator enables it (`nvidia-smi -i N -mig 1`); nothing here switches it.

- `read_profiles(nvml, handle)`: the GPU's GPU-instance profiles and each one's placements, or
  None when MIG mode is off (then the GPU is offered whole or in shares, as before).
- `MigInstances`: create the GPU instance and its compute instance of one placement, find the
  instances a GPU has, destroy one. Every NVML failure is a `MigError` naming the call and code.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

MEMORY_SLICES = 8  # a GPU's memory slices: placements are in these units (A100, H100, H200)
# NVML_GPU_INSTANCE_PROFILE_* indexes 0..NVML_GPU_INSTANCE_PROFILE_COUNT-1
_GI_PROFILE_COUNT = 0x12
# compute-instance profile that spans a whole GPU instance of N compute slices
# (NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,6,7,8}_SLICE)
_CI_PROFILE_OF_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23


class MigError(RuntimeError):
    """An NVML MIG call failed; `code` is NVML's return code."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of a GPU, as NVML describes it."""

    name: str  # "1g.10gb" (NVML's "MIG 1g.10gb" without the prefix)
    profile_id: int  # NVML's profile ID (nvidia-smi mig -lgip "ID"): what create takes
    compute_slices: int
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[int, ...]  # first memory slice of each placement
    size: int  # memory slices a placement spans

    def memory_slices(self, start: int) -> range:
        return range(start, start + self.size)


@dataclass(frozen=True)
class MigInstance:
    """A GPU instance with its compute instance: one MIG device."""

    gpu_uuid: str
    gi_id: int
    ci_id: int
    profile_id: int
    start: int
    uuid: str  # "MIG-..."; what CUDA_VISIBLE_DEVICES names


def _code(e: Exception) -> int | None:
    value = getattr(e, "value", None)
    return value if isinstance(value, int) else None


def _name(raw: bytes | str) -> str:
    text = raw.decode() if isinstance(raw, bytes) else raw
    return text.removeprefix("MIG ").strip()


def read_profiles(nvml: Any, handle: Any) -> tuple[MigProfile, ...] | None:
    """The GPU's profiles with their placements; None when its MIG mode is not enabled (or the
    GPU has no MIG: NVML says not supported). A pending change counts as not enabled: the mode
    applies only after the GPU's reset, which is the operator's to do."""
    mig_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
    if mig_mode is None:  # bindings older than MIG (R450)
        return None
    try:
        current, _pending = mig_mode(handle)
    except nvml.NVMLError as e:
        if _code(e) == NVML_ERROR_NOT_SUPPORTED:
            return None
        raise MigError(f"nvmlDeviceGetMigMode: {e}", _code(e)) from None
    if current != 1:
        return None
    profiles = []
    for index in range(_GI_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except nvml.NVMLError as e:
            if _code(e) in (NVML_ERROR_NOT_SUPPORTED, 2):  # not on this GPU; 2: an index this driver lacks
                continue
            raise MigError(f"nvmlDeviceGetGpuInstanceProfileInfo({index}): {e}", _code(e)) from None
        if info.instanceCount == 0:
            continue
        placements = _placements(nvml, handle, info.id)
        profiles.append(MigProfile(
            name=_name(info.name), profile_id=int(info.id), compute_slices=int(info.sliceCount),
            memory_bytes=int(info.memorySizeMB) << 20, multiprocessors=int(info.multiprocessorCount),
            copy_engines=int(info.copyEngineCount), decoders=int(info.decoderCount),
            encoders=int(info.encoderCount), jpeg_engines=int(info.jpegCount), ofa_engines=int(info.ofaCount),
            placements=tuple(p.start for p in placements), size=int(placements[0].size) if placements else 0))
    return tuple(profiles)


def _placements(nvml: Any, handle: Any, profile_id: int) -> list[Any]:
    count = ctypes.c_uint(0)
    array = (nvml.c_nvmlGpuInstancePlacement_t * MEMORY_SLICES)()
    count.value = MEMORY_SLICES
    try:
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    except nvml.NVMLError as e:
        raise MigError(f"nvmlDeviceGetGpuInstancePossiblePlacements({profile_id}): {e}", _code(e)) from None
    return [array[i] for i in range(count.value)]


class MigInstances:
    """GPU and compute instances of the node's GPUs, made and destroyed through NVML."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def _gpu(self, gpu_uuid: str) -> Any:
        try:
            return self.nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        except self.nvml.NVMLError as e:
            raise MigError(f"GPU {gpu_uuid}: {e}", _code(e)) from None

    def create(self, gpu_uuid: str, profile: MigProfile, start: int) -> MigInstance:
        """The GPU instance of `profile` at memory slice `start` and its one compute instance
        spanning it. A compute instance that cannot be made takes its GPU instance with it."""
        nvml = self.nvml
        handle = self._gpu(gpu_uuid)
        placement = nvml.c_nvmlGpuInstancePlacement_t(start, profile.size)
        try:
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.profile_id, ctypes.byref(placement))
        except nvml.NVMLError as e:
            why = (" (the placement overlaps an instance, or the profile's instances are all made)"
                   if _code(e) == NVML_ERROR_INSUFFICIENT_RESOURCES else "")
            raise MigError(f"creating a {profile.name} GPU instance at memory slice {start} of {gpu_uuid}: {e}{why}",
                           _code(e)) from None
        try:
            ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, _CI_PROFILE_OF_SLICES[profile.compute_slices])
        except (nvml.NVMLError, KeyError) as e:
            self._destroy_gi(gi, gpu_uuid)
            raise MigError(f"creating the compute instance of a {profile.name} GPU instance on {gpu_uuid}: {e}",
                           _code(e)) from None
        return self._instance(gpu_uuid, handle, gi, ci)

    def _instance(self, gpu_uuid: str, handle: Any, gi: Any, ci: Any) -> MigInstance:
        nvml = self.nvml
        gi_info = nvml.nvmlGpuInstanceGetInfo(gi)
        ci_info = nvml.nvmlComputeInstanceGetInfo(ci)
        return MigInstance(gpu_uuid, int(gi_info.id), int(ci_info.id), int(gi_info.profileId),
                           int(gi_info.placement.start), self._mig_uuid(handle, int(gi_info.id), int(ci_info.id)))

    def _mig_uuid(self, handle: Any, gi_id: int, ci_id: int) -> str:
        nvml = self.nvml
        for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nvml.NVMLError:
                continue
            if (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig)) == (gi_id, ci_id):
                uuid = nvml.nvmlDeviceGetUUID(mig)
                return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        raise MigError(f"no MIG device of GPU instance {gi_id}, compute instance {ci_id}")

    def list(self, gpu_uuid: str, profiles: tuple[MigProfile, ...]) -> list[MigInstance]:
        """The GPU's GPU instances now, whoever made them; one without a compute instance (a
        creation cut short) has ci_id -1 and uuid ""."""
        nvml = self.nvml
        handle = self._gpu(gpu_uuid)
        found = []
        for profile in profiles:
            array = (nvml.c_nvmlGpuInstance_t * MEMORY_SLICES)()
            count = ctypes.c_uint(0)
            try:
                nvml.nvmlDeviceGetGpuInstances(handle, profile.profile_id, array, ctypes.byref(count))
            except nvml.NVMLError as e:
                raise MigError(f"listing {profile.name} GPU instances of {gpu_uuid}: {e}", _code(e)) from None
            for gi in array[:count.value]:
                cis = (nvml.c_nvmlComputeInstance_t * MEMORY_SLICES)()
                n = ctypes.c_uint(0)
                ci_profile = _CI_PROFILE_OF_SLICES.get(profile.compute_slices, 0)
                nvml.nvmlGpuInstanceGetComputeInstances(gi, ci_profile, cis, ctypes.byref(n))
                if n.value:
                    found.append(self._instance(gpu_uuid, handle, gi, cis[0]))
                else:
                    info = nvml.nvmlGpuInstanceGetInfo(gi)
                    found.append(MigInstance(gpu_uuid, int(info.id), -1, int(info.profileId),
                                             int(info.placement.start), ""))
        return found

    def destroy(self, gpu_uuid: str, gi_id: int) -> bool:
        """Destroy the GPU instance `gi_id` and its compute instances; False when it is gone already."""
        nvml = self.nvml
        handle = self._gpu(gpu_uuid)
        try:
            gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
        except nvml.NVMLError as e:
            if _code(e) == NVML_ERROR_NOT_FOUND:
                return False
            raise MigError(f"GPU instance {gi_id} of {gpu_uuid}: {e}", _code(e)) from None
        for ci_profile in sorted(set(_CI_PROFILE_OF_SLICES.values())):
            cis = (nvml.c_nvmlComputeInstance_t * MEMORY_SLICES)()
            n = ctypes.c_uint(0)
            try:
                nvml.nvmlGpuInstanceGetComputeInstances(gi, ci_profile, cis, ctypes.byref(n))
            except nvml.NVMLError:
                continue
            for ci in cis[:n.value]:
                try:
                    nvml.nvmlComputeInstanceDestroy(ci)
                except nvml.NVMLError as e:
                    why = " (processes still use it)" if _code(e) == NVML_ERROR_IN_USE else ""
                    raise MigError(f"destroying the compute instance of GPU instance {gi_id} on {gpu_uuid}: "
                                   f"{e}{why}", _code(e)) from None
        self._destroy_gi(gi, gpu_uuid, gi_id)
        return True

    def _destroy_gi(self, gi: Any, gpu_uuid: str, gi_id: int | None = None) -> None:
        try:
            self.nvml.nvmlGpuInstanceDestroy(gi)
        except self.nvml.NVMLError as e:
            raise MigError(f"destroying GPU instance {gi_id if gi_id is not None else '(new)'} on {gpu_uuid}: {e}",
                           _code(e)) from None


# ---- the operator's choice: which GPUs are offered as MIG devices ---------------------------

MIG_GPUS_ACCEPTED = "none, all, or GPU indexes like 0,2"


class GpuSet:
    """`--mig-gpus`: `none`, `all`, or GPU indexes (`0,2`)."""

    def __init__(self, indexes: frozenset[int] | None = frozenset()) -> None:
        self.indexes = indexes  # None: all

    @classmethod
    def parse(cls, text: str) -> GpuSet:
        """A GPU list; ValueError says what is wrong with `text` (the caller names the flag)."""
        text = text.strip()
        if text in ("", "none"):
            return cls(frozenset())
        if text == "all":
            return cls(None)
        try:
            indexes = frozenset(int(part) for part in text.split(","))
        except ValueError:
            raise ValueError(f"{text!r}: expected {MIG_GPUS_ACCEPTED}") from None
        if any(i < 0 for i in indexes):
            raise ValueError(f"{text!r}: GPU indexes are 0 or more")
        return cls(indexes)

    def __contains__(self, index: object) -> bool:
        return self.indexes is None or index in self.indexes

    def __bool__(self) -> bool:
        return self.indexes is None or bool(self.indexes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GpuSet) and self.indexes == other.indexes

    def __hash__(self) -> int:
        return hash(self.indexes)

    def __repr__(self) -> str:
        return "all" if self.indexes is None else ",".join(map(str, sorted(self.indexes))) or "none"


NO_MIG = GpuSet()
