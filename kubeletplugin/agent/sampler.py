"""NVML sampling: per GPU memory, utilization, temperature and power; per process memory and
GPU utilization (host pids).

Mock nodes sample the simulated NVML every container of the node maps (the SimDriver's
library and state file): it is loaded by absolute path before pynvml's nvmlInit
(discovery.load_nvml, as a driver root's NVML is), so pynvml's own dlopen("libnvidia-ml.so.1")
finds it by soname.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

from dra_driver.discovery import load_nvml
from dra_driver.log import get_logger

log = get_logger("agent.sampler")


@dataclass
class GpuSample:
    uuid: str
    index: int
    memory_used: int
    memory_total: int
    utilization: float | None            # percent of the last period
    temperature: float | None = None     # Celsius
    power_watts: float | None = None
    process_memory: dict[int, int] = field(default_factory=dict)    # host pid -> bytes
    process_util: dict[int, float] = field(default_factory=dict)    # host pid -> percent since last sample
    mig: bool = False  # a MIG device (uuid "MIG-..."; index: its parent GPU's), not a whole GPU


def load_simulated_nvml(sim_dir: str, env: dict[str, str]) -> None:
    """Make pynvml use the node's simulated NVML (call before the first nvmlInit).

    `env` is the simulated driver's environment (SimDriver.env): the node's state file and
    the same device count and size the containers get, so whoever opens it first agrees.
    """
    os.environ.update(env)
    load_nvml(sim_dir)


T = TypeVar("T")
Handle = Any  # an NVML device handle (pynvml has no types)


def _optional(fn: Callable[..., T], *args: Any) -> T | None:
    """A value NVML may not have on this GPU (temperature, power): None when unsupported."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


# nvmlProcessInfo_t as pynvml declares it (pid, usedGpuMemory, gpuInstanceId, computeInstanceId):
# the struct module reads pid and usedGpuMemory at pynvml's offsets, no Python object per entry.
_INFO = pynvml.c_nvmlProcessInfo_v3_t
_INFO_SIZE = ctypes.sizeof(_INFO)
_PID, _USED = _INFO.pid, _INFO.usedGpuMemory
_ENTRY = struct.Struct(f"={_PID.offset}xI{_USED.offset - _PID.offset - 4}xQ{_INFO_SIZE - _USED.offset - 8}x")
_NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE (WDDM): pynvml's None, counted 0 as before
_FIRST_CAPACITY = 64
_TRIES = 8  # INSUFFICIENT_SIZE again and again: processes appear faster than the buffer doubles
_RUNNING = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")


class RunningProcesses:
    """nvmlDeviceGetComputeRunningProcesses_v3 (v2 on older drivers: the same struct) called
    through the function pointer of the NVML pynvml loaded, into a buffer kept per thread: one
    C call per GPU and poll, the answer read by `struct`. pynvml's own wrapper asks twice (the
    count, then the entries, into a fresh array) and builds an object per process per call: at
    128 processes every 50 ms that was most of the backstop's CPU. Same answer: host pid ->
    bytes summed over its entries (tests/agent/test_sampler_nvml.py holds the two equal on
    the simulated NVML)."""

    def __init__(self, fn: Callable[..., int] | None = None) -> None:
        """fn: the C function (tests give a stand-in); default NVML's, as pynvml loaded it."""
        self._fn = fn
        for name in _RUNNING if fn is None else ():
            try:
                self._fn = pynvml._nvmlGetFunctionPointer(name)  # pynvml's loaded library and cache
                break
            except pynvml.NVMLError:
                continue
        if self._fn is None:
            log.error("NVML has no nvmlDeviceGetComputeRunningProcesses_v3 or _v2: per-process memory "
                      "is unread (the backstop sees no process)")
        self._local = threading.local()  # the agent's period and the backstop query from two threads

    def _buffer(self, capacity: int) -> ctypes.Array[ctypes.c_char]:
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < capacity * _INFO_SIZE:
            buf = self._local.buf = ctypes.create_string_buffer(capacity * _INFO_SIZE)
        return buf

    def __call__(self, h: Handle) -> dict[int, int]:
        """host pid -> bytes on the GPU of handle h; raises pynvml.NVMLError as pynvml would."""
        if self._fn is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        count = ctypes.c_uint(0)
        capacity = _FIRST_CAPACITY
        for _ in range(_TRIES):
            buf = self._buffer(capacity)  # (kept: the largest this thread has needed)
            count.value = len(buf) // _INFO_SIZE
            ret = self._fn(h, ctypes.byref(count), buf)
            if ret == pynvml.NVML_SUCCESS:
                break
            if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                raise pynvml.NVMLError(ret)
            capacity = count.value * 2 + 5  # room for processes that start meanwhile (as pynvml)
        else:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        answer = memoryview(buf)[:count.value * _INFO_SIZE]
        out: dict[int, int] = dict(_ENTRY.iter_unpack(answer))
        if len(out) == count.value and _NOT_AVAILABLE not in out.values():
            return out  # one entry per pid, each with its bytes: the usual answer, built in C
        out = {}
        for pid, used in _ENTRY.iter_unpack(answer):
            out[pid] = out.get(pid, 0) + (0 if used == _NOT_AVAILABLE else used)
        return out


@dataclass(frozen=True)
class MigDevice:
    """A MIG device (a GPU instance with its compute instance) of a GPU in MIG mode."""

    uuid: str        # "MIG-...": what a claim on it names (PreparedGpu.uuid)
    index: int       # its parent GPU's index
    handle: Handle


class Sampler:
    """Each GPU, and each MIG device of a GPU in MIG mode, sampled by its own UUID.

    A claim on a MIG device names the MIG device's UUID, and NVML lists a process in a MIG
    instance with its memory on that MIG device's handle (the parent's aggregate is a privileged
    caller's only, and utilization, the GPU's or per process, is not supported in MIG mode).
    Instances come and go while the agent runs (the plugin makes one at Prepare): they are listed
    again each agent period (`sample`) and when the backstop asks for a UUID the sampler has not
    looked for yet, never at every poll."""

    def __init__(self) -> None:
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._uuids = [pynvml.nvmlDeviceGetUUID(h) for h in self._handles]
        self._last_seen = [0] * len(self._handles)  # NVML timestamps (us) of the previous util sample
        self._running = RunningProcesses()
        self._missing: set[str] = set()  # UUIDs asked for that no listing found: not listed again for them
        # replaced whole by list_migs (the backstop's thread reads them): the MIG devices, and every
        # GPU's and MIG device's handle by UUID
        self._migs: dict[str, MigDevice] = {}
        self._devices: dict[str, Handle] = dict(zip(self._uuids, self._handles, strict=True))
        self.list_migs()

    def list_migs(self) -> None:
        """The MIG devices of every GPU in MIG mode as they are now: a few NVML calls per such GPU
        (nvmlDeviceGetMaxMigDeviceCount, then a handle and a UUID per device made)."""
        found: dict[str, MigDevice] = {}
        for index, h in enumerate(self._handles):
            try:
                if not pynvml.nvmlDeviceGetMigMode(h)[0]:
                    continue
                count = pynvml.nvmlDeviceGetMaxMigDeviceCount(h)
            except pynvml.NVMLError:  # no MIG on this GPU (NOT_SUPPORTED before Ampere)
                continue
            for i in range(count):
                try:
                    m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
                    uuid = pynvml.nvmlDeviceGetUUID(m)
                except pynvml.NVMLError:  # NOT_FOUND: no device at this index
                    continue
                found[uuid] = MigDevice(uuid, index, m)
        self._migs = found
        self._devices = {**dict(zip(self._uuids, self._handles, strict=True)),
                         **{m.uuid: m.handle for m in found.values()}}

    def sample(self) -> list[GpuSample]:
        self.list_migs()
        return [self._sample(i, h) for i, h in enumerate(self._handles)] + [
            self._sample_mig(m) for m in self._migs.values()]

    def _sample(self, index: int, h: Handle) -> GpuSample:
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        util = _optional(pynvml.nvmlDeviceGetUtilizationRates, h)
        power = _optional(pynvml.nvmlDeviceGetPowerUsage, h)
        s = GpuSample(uuid=pynvml.nvmlDeviceGetUUID(h), index=index, memory_used=mem.used, memory_total=mem.total,
                      utilization=None if util is None else float(util.gpu),
                      temperature=_optional(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
                      power_watts=None if power is None else power / 1000.0)
        s.process_memory = _optional(self._running, h) or {}
        # Samples newer than the previous call: the share each process had in the last period.
        last_seen = self._last_seen[index] or int(time.time() * 1e6) - 1_000_000
        samples: dict[int, list[float]] = {}
        for p in _optional(pynvml.nvmlDeviceGetProcessUtilization, h, last_seen) or []:
            samples.setdefault(p.pid, []).append(float(p.smUtil))
            self._last_seen[index] = max(self._last_seen[index], p.timeStamp)
        s.process_util = {pid: sum(v) / len(v) for pid, v in samples.items()}
        return s

    def _sample_mig(self, m: MigDevice) -> GpuSample:
        """Its memory and its processes' (no utilization on MIG: NOT_SUPPORTED; temperature and
        power are the parent's)."""
        mem = _optional(pynvml.nvmlDeviceGetMemoryInfo, m.handle)
        return GpuSample(uuid=m.uuid, index=m.index, memory_used=mem.used if mem else 0,
                         memory_total=mem.total if mem else 0, utilization=None, mig=True,
                         process_memory=_optional(self._running, m.handle) or {})

    def process_memory(self, uuids: Collection[str] | None = None) -> dict[str, dict[int, int]]:
        """The backstop's cheap query: per GPU or MIG device uuid (of `uuids`, default all), host
        pid -> bytes (one NVML call per device). A device whose query failed is left out: unread is
        not empty (docs/agent.md)."""
        devices = self._devices
        if uuids is None:
            uuids = devices
        elif missing := {u for u in uuids if u not in devices}:
            if not missing <= self._missing:  # a MIG device made since the period: looked for once
                self.list_migs()
                devices = self._devices
                missing.difference_update(devices)
            self._missing = missing
        out: dict[str, dict[int, int]] = {}
        for uuid in uuids:
            h = devices.get(uuid)
            if h is None:
                continue
            try:
                out[uuid] = self._running(h)
            except pynvml.NVMLError:
                continue
        return out

    def close(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
