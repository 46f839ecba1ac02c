"""The kubelet's DRA device health (KEP-4680, ResourceHealthStatus) on the playground's node.

What the kubelet does, from k8s.io/kubernetes pkg/kubelet/cm/dra (1.36: healthinfo.go, manager.go
HandleWatchResourcesStream and UpdateAllocatedResourcesStatus):

- it opens the plugin's `NodeWatchResources` stream (dra_health_v1alpha1) and keeps the health
  of each (driver, pool, device) it hears, with the time and the device's
  health_check_timeout_seconds (30 s when the plugin sends none); a device not heard of within
  its timeout is Unknown; when the stream ends the driver's entries are forgotten;
- when a device's health changes, the pods whose claims hold the device get a status update;
- each container that names claims in `resources.claims` gets, in
  `status.containerStatuses[].allocatedResourcesStatus`, one entry per claim it names:
  `claim:<pod claim>` or `claim:<pod claim>/<request>`, listing every device of that claim (all of
  them, not only the request's, as upstream does) by its first CDI device ID (else
  `<driver>/<pool>/<device>`) with Healthy, Unhealthy or Unknown; an entry with no device is left out.

Not done: the health checkpoint file (the playground's kubelet does not restart) and the
`message` of ResourceHealth (ResourceHealthStatusMessage gate, not read by the version above).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

from dra_driver.kube import JSON
from dra_driver.log import get_logger
from kubeletplugin.grpcapi import dra_health_v1alpha1_pb2 as pb
from kubeletplugin.grpcapi import dra_health_v1alpha1_pb2_grpc

DEFAULT_TIMEOUT_S = 30.0  # the kubelet's DefaultHealthTimeout
HEALTH = {pb.HEALTHY: "Healthy", pb.UNHEALTHY: "Unhealthy"}  # anything else: Unknown
log = get_logger("playground.kubelet.health")


@dataclass(frozen=True)
class PreparedDevice:
    """One device NodePrepareResources returned for a claim (the kubelet's claimInfo DriverState)."""

    driver: str
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]

    @property
    def resource_id(self) -> str:
        return self.cdi_device_ids[0] if self.cdi_device_ids else f"{self.driver}/{self.pool}/{self.device}"


@dataclass
class _Heard:
    health: str
    at: float  # time.monotonic() when heard
    timeout_s: float


class HealthInfoCache:
    """Device health by (driver, pool, device), as healthinfo.go keeps it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: dict[tuple[str, str, str], _Heard] = {}

    def update(self, driver: str, answer: pb.NodeWatchResourcesResponse) -> set[tuple[str, str, str]]:
        """Record one answer of the stream; the devices whose health changed."""
        now = time.monotonic()
        changed = set()
        with self._lock:
            for d in answer.devices:
                key = (driver, d.device.pool_name, d.device.device_name)
                timeout = d.health_check_timeout_seconds if d.health_check_timeout_seconds > 0 else DEFAULT_TIMEOUT_S
                heard = _Heard(HEALTH.get(d.health, "Unknown"), now, timeout)
                old = self._devices.get(key)
                if old is None or old.health != heard.health:
                    changed.add(key)
                self._devices[key] = heard
        return changed

    def health(self, driver: str, pool: str, device: str) -> str:
        with self._lock:
            heard = self._devices.get((driver, pool, device))
        if heard is None or time.monotonic() - heard.at > heard.timeout_s:
            return "Unknown"
        return heard.health

    def clear_driver(self, driver: str) -> None:
        with self._lock:
            for key in [k for k in self._devices if k[0] == driver]:
                del self._devices[key]


# The health services a kubelet 1.37 opens a stream for, when a plugin's registration lists one
# (pickHealthService, pkg/kubelet/cm/dra/plugin): without one, every device's health is Unknown.
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


def advertises_health(supported_versions: Iterable[str]) -> bool:
    """Whether a plugin's registration (GetInfo's supported_versions) names a health service the
    kubelet reads."""
    return any(service in HEALTH_SERVICES for service in supported_versions)


class HealthWatch:
    """The kubelet's NodeWatchResources stream from one plugin, in a thread: the cache follows it,
    on_change(changed device keys) is called when a device's health changes."""

    def __init__(self, dra_socket: str, driver: str, cache: HealthInfoCache,
                 on_change: Callable[[set[tuple[str, str, str]]], None]):
        self.driver = driver
        self.cache = cache
        self.on_change = on_change
        self._channel = grpc.insecure_channel(f"unix://{dra_socket}")
        self._call = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(self._channel).NodeWatchResources(
            pb.NodeWatchResourcesRequest())
        self._thread = threading.Thread(target=self._run, name="kubelet-health", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for answer in self._call:
                changed = self.cache.update(self.driver, answer)
                if changed:
                    self.on_change(changed)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                log.warning("device health stream ended", driver=self.driver, error=str(e.details()))
        finally:
            self.cache.clear_driver(self.driver)  # as the kubelet does when a stream exits

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(timeout=5)
        self._channel.close()


def allocated_resources_status(container: JSON, devices_by_pod_claim: dict[str, list[PreparedDevice]],
                               cache: HealthInfoCache) -> list[JSON]:
    """A container's allocatedResourcesStatus, as UpdateAllocatedResourcesStatus builds it."""
    entries = []
    for used in (container.get("resources") or {}).get("claims") or []:
        name = f"claim:{used['name']}" + (f"/{used['request']}" if used.get("request") else "")
        resources = [{"resourceID": d.resource_id, "health": cache.health(d.driver, d.pool, d.device)}
                     for d in devices_by_pod_claim.get(used["name"], [])]
        if resources:
            entries.append({"name": name, "resources": resources})
    return entries
