"""The kubelet's DRA health service (dra_health_v1alpha1 `NodeWatchResources`), served on the
plugin's DRA socket: the health of every device this node publishes, sent when a stream opens,
whenever a GPU's health changes, and every RESEND_S seconds (the kubelet marks a device Unknown
when it hears nothing for health_check_timeout_seconds). The kubelet shows it in the status of
the pods using the device (ResourceHealthStatus)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc

from dra_driver.log import get_logger

from .grpcapi import dra_health_v1alpha1_pb2 as pb
from .grpcapi import dra_health_v1alpha1_pb2_grpc

log = get_logger("kubeletplugin.health")

RESEND_S = 10.0
TIMEOUT_S = 30  # 3 resends


class DeviceHealthServicer(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, pool: str, devices: Callable[[], list[tuple[str, bool, str]]], resend_s: float = RESEND_S):
        """devices(): (device name, healthy, message) of every device the node publishes now."""
        self.pool = pool
        self.devices = devices
        self.resend_s = resend_s
        self._changed = threading.Condition()
        self._version = 0
        self._closed = False

    def notify(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def close(self) -> None:
        """End every open stream (plugin shutdown)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def snapshot(self) -> pb.NodeWatchResourcesResponse:
        now = int(time.time())
        return pb.NodeWatchResourcesResponse(devices=[
            pb.DeviceHealth(device=pb.DeviceIdentifier(pool_name=self.pool, device_name=name),
                            health=pb.HEALTHY if healthy else pb.UNHEALTHY, last_updated_time=now,
                            health_check_timeout_seconds=TIMEOUT_S, message="" if healthy else message)
            for name, healthy, message in self.devices()])

    def NodeWatchResources(self, request: pb.NodeWatchResourcesRequest,
                           context: grpc.ServicerContext) -> Iterator[pb.NodeWatchResourcesResponse]:
        seen: int | None = None
        while context.is_active():
            with self._changed:
                if seen == self._version and not self._closed:
                    self._changed.wait(self.resend_s)
                if self._closed:
                    return
                seen = self._version
            try:
                yield self.snapshot()
            except Exception:  # discovery failed this time: the next resend tries again
                log.exception("device health snapshot failed")
