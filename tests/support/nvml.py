"""A fake pynvml for the discovery and GPU health tests, and driver roots holding the simulated
NVML for the tests of --driver-root."""

import os
import queue
import shutil
import time
import types
from collections import namedtuple
from pathlib import Path

import pytest

from dra_driver.discovery import SIM_DRIVER_VERSION
from dra_driver.hookpath import NativeFilesMissing, native_paths


class FakeNVMLError(Exception):
    pass


class FakeNVMLTimeout(FakeNVMLError):
    pass


def fake_pynvml(fail_init=None, lost_index=None):
    """A pynvml stand-in with two Hopper GPUs; optionally no driver or one lost GPU.

    Events: `m.events.put((index, event_type, data))` is what nvmlEventSetWait_v2 returns next
    (for GPUs registered for that type); `m.pending_retirement` holds the indexes whose page
    retirement waits for a reset."""
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVMLError_Timeout = FakeNVMLTimeout
    m.events = queue.Queue()
    m.registered = {}  # index -> event types
    m.pending_retirement = set()
    Event = namedtuple("Event", "device eventType eventData")

    def wait(event_set, timeout_ms):
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                index, event_type, data = m.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise FakeNVMLTimeout("Timeout") from None
            if m.registered.get(index, 0) & event_type:
                return Event(index, event_type, data)

    def by_uuid(uuid):
        index = int(uuid.rsplit("-", 1)[1])
        return handle(index)

    m.nvmlShutdown = lambda: None
    m.nvmlEventSetCreate = lambda: "event-set"
    m.nvmlEventSetFree = lambda s: None
    m.nvmlDeviceGetSupportedEventTypes = lambda h: 0x1 | 0x2 | 0x8
    m.nvmlDeviceRegisterEvents = lambda h, types, s: m.registered.__setitem__(h, m.registered.get(h, 0) | types)
    m.nvmlEventSetWait_v2 = wait
    m.nvmlDeviceGetHandleByUUID = by_uuid
    m.nvmlDeviceGetRetiredPagesPendingStatus = lambda h: int(h in m.pending_retirement)
    m.nvmlDeviceGetRemappedRows = lambda h: (0, 0, 0, 0)  # corrected, uncorrected, pending, failed
    Mem = namedtuple("Mem", "total free used")

    def init():
        if fail_init:
            raise FakeNVMLError(fail_init)

    def handle(i):
        if i == lost_index:
            raise FakeNVMLError("GPU is lost")
        return i

    m.nvmlInit = init
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlSystemGetDriverVersion = lambda: b"580.65.06"
    m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 13000
    m.nvmlDeviceGetHandleByIndex = handle
    m.nvmlDeviceGetUUID = lambda h: f"GPU-real-{h}"
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    m.nvmlDeviceGetMinorNumber = lambda h: h + 10
    m.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    m.nvmlDeviceGetMemoryInfo = lambda h: Mem(80 << 30, 80 << 30, 0)
    m.nvmlDeviceGetArchitecture = lambda h: 9
    m.nvmlDeviceGetNumGpuCores = lambda h: 132 * 128  # an H100 SXM: 132 SMs of 128 cores
    m.nvmlDeviceGetBrand = lambda h: 14  # NVML_BRAND_NVIDIA
    Pci = namedtuple("Pci", "busId")
    m.nvmlDeviceGetPciInfo = lambda h: Pci(f"00000000:{0x3B + h:02X}:00.0".encode())
    return m


def _sim_built() -> bool:
    try:
        return bool(native_paths())
    except NativeFilesMissing:
        return False


needs_sim = pytest.mark.skipif(not _sim_built(), reason="the simulated NVML is not built (make hook)")


def driver_root(tmp_path: Path, libdir: str | None = "usr/lib/x86_64-linux-gnu") -> Path:
    """A folder laid out like a driver root (the host's / or the GPU Operator's /run/nvidia/driver):
    the simulated NVML as libnvidia-ml.so.<version> under `libdir`, with the driver's soname link."""
    root = tmp_path / "driver-root"
    (root / "usr/bin").mkdir(parents=True)
    if libdir is not None:
        lib = root / libdir
        lib.mkdir(parents=True)
        shutil.copy(native_paths()["sim_nvml"], lib / f"libnvidia-ml.so.{SIM_DRIVER_VERSION}")
        (lib / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{SIM_DRIVER_VERSION}")
    return root


def sim_nvml_env(state: Path, devices: int, memory: int) -> dict[str, str]:
    """The environment of a child process whose NVML is the simulated one: its devices, and no
    LD_LIBRARY_PATH or GPUSHARE_* of this process, so only a driver root can supply the library."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH" and not k.startswith("GPUSHARE_")}
    return env | {"GPUSHARE_SIM_STATE": str(state), "GPUSHARE_SIM_DEVICES": str(devices),
                  "GPUSHARE_SIM_MEMORY": str(memory)}
