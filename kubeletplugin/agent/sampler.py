"""NVML sampling: per GPU memory, utilization, temperature and power; per process memory and
GPU utilization (host pids).

Mock nodes sample the simulated NVML every container of the node maps (the SimDriver's
library and state file): it is loaded by absolute path before pynvml's nvmlInit
(discovery.load_nvml, as a driver root's NVML is), so pynvml's own dlopen("libnvidia-ml.so.1")
finds it by soname.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
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


def _process_memory(h: Handle) -> dict[int, int]:
    return _sum_by_pid(_optional(pynvml.nvmlDeviceGetComputeRunningProcesses, h) or [])


def _sum_by_pid(procs: list[Any]) -> dict[int, int]:
    out: dict[int, int] = {}
    for p in procs:
        out[p.pid] = out.get(p.pid, 0) + (p.usedGpuMemory or 0)
    return out


class Sampler:
    def __init__(self) -> None:
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._uuids = [pynvml.nvmlDeviceGetUUID(h) for h in self._handles]
        self._last_seen = [0] * len(self._handles)  # NVML timestamps (us) of the previous util sample

    def sample(self) -> list[GpuSample]:
        return [self._sample(i, h) for i, h in enumerate(self._handles)]

    def _sample(self, index: int, h: Handle) -> GpuSample:
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        util = _optional(pynvml.nvmlDeviceGetUtilizationRates, h)
        power = _optional(pynvml.nvmlDeviceGetPowerUsage, h)
        s = GpuSample(uuid=pynvml.nvmlDeviceGetUUID(h), index=index, memory_used=mem.used, memory_total=mem.total,
                      utilization=None if util is None else float(util.gpu),
                      temperature=_optional(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
                      power_watts=None if power is None else power / 1000.0)
        s.process_memory = _process_memory(h)
        # Samples newer than the previous call: the share each process had in the last period.
        last_seen = self._last_seen[index] or int(time.time() * 1e6) - 1_000_000
        samples: dict[int, list[float]] = {}
        for p in _optional(pynvml.nvmlDeviceGetProcessUtilization, h, last_seen) or []:
            samples.setdefault(p.pid, []).append(float(p.smUtil))
            self._last_seen[index] = max(self._last_seen[index], p.timeStamp)
        s.process_util = {pid: sum(v) / len(v) for pid, v in samples.items()}
        return s

    def process_memory(self) -> dict[str, dict[int, int]]:
        """The backstop's cheap query: per GPU uuid, host pid -> bytes (one NVML call per GPU).
        A GPU whose query failed is left out: unread is not empty (docs/agent.md)."""
        out: dict[str, dict[int, int]] = {}
        for uuid, h in zip(self._uuids, self._handles, strict=True):
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            except pynvml.NVMLError:
                continue
            out[uuid] = _sum_by_pid(procs)
        return out

    def close(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
