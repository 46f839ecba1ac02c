"""GPU health from NVML events: XID and ECC errors.

A critical event marks its GPU unhealthy: the ResourceSlice controller taints the GPU's devices
(NoSchedule, or NoExecute with --unhealthy-taint-effect) and the kubelet hears it through the
DRA health service (kubeletplugin/healthservice.py), so pods using the GPU show it in their
status. Critical: a double-bit ECC error, and every XID except the ones an application causes
by itself (the same list NVIDIA's device plugin skips) and those the operator adds with
--health-ignore-xids (or `all`). Single-bit ECC errors are corrected by the GPU and not watched.

Recovery: NVML sends no "healthy again" event. A mark clears once `recovery_s` passed without
a new critical event on the GPU *and* the GPU answers NVML again with no page retirement or
row remapping pending (those need a GPU reset, so a GPU with a double-bit error stays marked
until it was reset).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from dra_driver.discovery import DeviceBackend, GpuInfo
from dra_driver.log import get_logger

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = get_logger("health")

# nvml.h nvmlEventType*
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
WATCHED_EVENTS = EVENT_DOUBLE_BIT_ECC | EVENT_XID

# XIDs caused by the application, not the GPU: a kernel's illegal address (13, 31), a stopped
# or killed context (43, 45), a video decoder error (68), a context-switch timeout (109).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# XIDs the operator ignores besides APPLICATION_XIDS (--health-ignore-xids): a set, or "all".
IgnoredXids = frozenset[int] | Literal["all"]


def classify(event_type: int, data: int, ignored: IgnoredXids = frozenset()) -> str | None:
    """The reason a GPU is unhealthy after this event, or None when the event is not critical."""
    if event_type & EVENT_DOUBLE_BIT_ECC:  # even with every XID ignored: the memory is damaged
        return "double-bit ECC error"
    if event_type & EVENT_XID and not (ignored == "all" or data in APPLICATION_XIDS or data in ignored):
        return f"XID {data}"
    return None


class HealthMonitor:
    """Waits for NVML events on every GPU in its own thread; `apply()` marks discovered GPUs."""

    def __init__(self, recovery_s: float = 300.0, wait_ms: int = 500, clock: Callable[[], float] = time.monotonic,
                 ignored_xids: IgnoredXids = frozenset()):
        self.recovery_s = recovery_s
        self.ignored_xids = ignored_xids  # besides APPLICATION_XIDS
        self.wait_ms = wait_ms  # also how often recovery is checked
        self.clock = clock
        self.listeners: list[Callable[[], None]] = []  # told when a GPU's health changes
        self._marks: dict[str, tuple[str, float]] = {}  # uuid -> (reason, time of the last critical event)
        self._events: dict[tuple[str, str], int] = {}  # (uuid, reason) -> critical events seen
        self._indexes: dict[str, int] = {}  # uuid -> GPU index, from the last discovery (for metrics)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None  # the pynvml module once started (it has no types)
        self._set: Any = None  # its event set handle

    def start(self) -> bool:
        """Register for events on every GPU; False (logged) when NVML cannot deliver them."""
        import pynvml

        try:
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._set = pynvml.nvmlEventSetCreate()
            count = pynvml.nvmlDeviceGetCount()
            for i in range(count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                try:
                    wanted = pynvml.nvmlDeviceGetSupportedEventTypes(handle) & WATCHED_EVENTS
                except pynvml.NVMLError:
                    wanted = WATCHED_EVENTS
                if wanted:
                    pynvml.nvmlDeviceRegisterEvents(handle, wanted, self._set)
        except pynvml.NVMLError as e:
            log.error("GPU health events unavailable; only discovery failures taint GPUs", error=str(e))
            self._close_nvml()
            return False
        extra = self.ignored_xids
        log.info("watching GPU health events", gpus=count, recovery_s=self.recovery_s,
                 ignored_xids="all" if extra == "all" else sorted(APPLICATION_XIDS | extra),
                 added_by_flag="all" if extra == "all" else sorted(extra))
        self._thread = threading.Thread(target=self._run, name="gpu-health", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._close_nvml()

    def _close_nvml(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        try:
            if self._set is not None:
                nvml.nvmlEventSetFree(self._set)
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
        self._set = None

    def _run(self) -> None:
        nvml = self._nvml
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._set, self.wait_ms)
                self.record(_text(nvml.nvmlDeviceGetUUID(data.device)), data.eventType, data.eventData)
            except nvml.NVMLError_Timeout:
                pass
            except nvml.NVMLError as e:  # never a tight loop on a broken event set
                log.warning("waiting for GPU events failed", error=str(e))
                self._stop.wait(1.0)
            self.check_recovery()

    # ---- state ----------------------------------------------------------------------------------
    def record(self, uuid: str, event_type: int, data: int) -> bool:
        """Take one event; True when it marked the GPU unhealthy."""
        reason = classify(event_type, data, self.ignored_xids)
        if reason is None:
            log.info("GPU event, not critical", gpu=uuid, event_type=hex(event_type), data=data)
            return False
        with self._lock:
            was = self._marks.get(uuid)
            self._marks[uuid] = (reason, self.clock())
            self._events[uuid, reason] = self._events.get((uuid, reason), 0) + 1
        log.error("GPU unhealthy", gpu=uuid, reason=reason, event_type=hex(event_type), data=data)
        if was is None or was[0] != reason:
            self._notify()
        return True

    def check_recovery(self) -> None:
        now = self.clock()
        with self._lock:
            due = [uuid for uuid, (_, at) in self._marks.items() if now - at >= self.recovery_s]
        cleared = [uuid for uuid in due if self._answers(uuid)]
        with self._lock:
            for uuid in cleared:
                if uuid in self._marks and now - self._marks[uuid][1] >= self.recovery_s:  # no event meanwhile
                    reason, _ = self._marks.pop(uuid)
                    log.info("GPU healthy again", gpu=uuid, was=reason, quiet_s=self.recovery_s)
        if cleared:
            self._notify()

    def _answers(self, uuid: str) -> bool:
        """NVML reaches the GPU and no retirement or remapping waits for a reset."""
        nvml = self._nvml
        if nvml is None:
            return True
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError:
            return False
        for pending in (lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle),
                        lambda: any(nvml.nvmlDeviceGetRemappedRows(handle)[2:4])):
            try:
                if pending():
                    return False
            except nvml.NVMLError:  # not supported on this GPU (or by the simulator)
                pass
        return True

    def unhealthy(self) -> dict[str, str]:
        """uuid -> reason of every GPU marked now."""
        with self._lock:
            return {uuid: reason for uuid, (reason, _) in self._marks.items()}

    def critical_events(self) -> dict[tuple[str, str], int]:
        """(uuid, reason) -> critical events seen since start."""
        with self._lock:
            return dict(self._events)

    def index_of(self, uuid: str) -> str:
        """The GPU's index as discovery last told it ("" before one did): the metrics' `gpu` label."""
        with self._lock:
            index = self._indexes.get(uuid)
        return "" if index is None else str(index)

    def apply(self, gpus: list[GpuInfo]) -> list[GpuInfo]:
        with self._lock:
            self._indexes.update({g.uuid: g.index for g in gpus})
        marks = self.unhealthy()
        return [replace(g, healthy=False, health_reason=marks[g.uuid]) if g.healthy and g.uuid in marks else g
                for g in gpus]

    def _notify(self) -> None:
        for listener in list(self.listeners):
            try:
                listener()
            except Exception:
                log.exception("a GPU health listener failed")


class HealthCollector:
    """Prometheus: GPUs marked unhealthy now, and critical events seen, by GPU (`gpu` its index and
    `UUID`, as dcgm-exporter names them) and reason."""

    def __init__(self, monitor: HealthMonitor):
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        marked = GaugeMetricFamily("gpushare_gpu_unhealthy", "1 while an NVML event keeps the GPU marked unhealthy",
                                   labels=["gpu", "UUID", "reason"])
        for uuid, reason in sorted(self.monitor.unhealthy().items()):
            marked.add_metric([self.monitor.index_of(uuid), uuid, reason], 1)
        events = CounterMetricFamily("gpushare_gpu_critical_events", "Critical NVML events (XID, double-bit ECC)",
                                     labels=["gpu", "UUID", "reason"])
        for (uuid, reason), n in sorted(self.monitor.critical_events().items()):
            events.add_metric([self.monitor.index_of(uuid), uuid, reason], n)
        yield marked
        yield events


class HealthAwareBackend:
    """A device backend whose GPUs carry the event health as well as discovery's."""

    def __init__(self, backend: DeviceBackend, monitor: HealthMonitor):
        self.backend = backend
        self.monitor = monitor
        self.name = backend.name

    def discover(self) -> list[GpuInfo]:
        return self.monitor.apply(self.backend.discover())


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
