"""The kubelet-facing gRPC services: registration, DRA v1 + v1beta1, health.

Each claim of a request gets its own entry in the answer; a claim that fails carries its
`error` and never fails the RPC, so one bad claim does not hold back the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

import grpc

from dra_driver.log import get_logger

from .claimref import ClaimError
from .driver import Driver
from .grpcapi import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from .metrics import Metrics

log = get_logger("kubeletplugin.server")

# The DRA services this plugin serves, as registration names them. The kubelet opens the device
# health stream (KEP-4680) only to a plugin that lists its health service here.
SUPPORTED_VERSIONS = ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]

# The same messages in both DRA API versions (DraServicer serves either).
PrepareRequest = dra_v1_pb2.NodePrepareResourcesRequest | dra_v1beta1_pb2.NodePrepareResourcesRequest
PrepareResponse = dra_v1_pb2.NodePrepareResourcesResponse | dra_v1beta1_pb2.NodePrepareResourcesResponse
UnprepareRequest = dra_v1_pb2.NodeUnprepareResourcesRequest | dra_v1beta1_pb2.NodeUnprepareResourcesRequest
UnprepareResponse = dra_v1_pb2.NodeUnprepareResourcesResponse | dra_v1beta1_pb2.NodeUnprepareResourcesResponse
Claim = dra_v1_pb2.Claim | dra_v1beta1_pb2.Claim
ClaimAnswer = (dra_v1_pb2.NodePrepareResourceResponse | dra_v1beta1_pb2.NodePrepareResourceResponse
               | dra_v1_pb2.NodeUnprepareResourceResponse | dra_v1beta1_pb2.NodeUnprepareResourceResponse)
_Result = TypeVar("_Result")


class RegistrationServicer(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, driver_name: str, endpoint: str, on_registered: Callable[[], None] = lambda: None):
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.registered: bool | None = None
        self.on_registered = on_registered

    def GetInfo(self, request: pluginregistration_pb2.InfoRequest,
                context: grpc.ServicerContext) -> pluginregistration_pb2.PluginInfo:
        return pluginregistration_pb2.PluginInfo(type="DRAPlugin", name=self.driver_name, endpoint=self.endpoint,
                                                 supported_versions=SUPPORTED_VERSIONS)

    def NotifyRegistrationStatus(self, request: pluginregistration_pb2.RegistrationStatus,
                                 context: grpc.ServicerContext) -> pluginregistration_pb2.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("registered with the kubelet", driver=self.driver_name, endpoint=self.endpoint)
            try:
                self.on_registered()
            except OSError as e:  # the hand-over at a later stop waits for nothing; serving goes on
                log.error("recording the registration", error=str(e))
        else:
            log.error("the kubelet refused the registration", driver=self.driver_name, reason=request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()


class DraServicer:
    """NodePrepareResources / NodeUnprepareResources for one API version (pb module)."""

    def __init__(self, driver: Driver, pb: ModuleType, metrics: Metrics):
        self.driver = driver
        self.pb = pb
        self.metrics = metrics
        self.has_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name  # v1 only

    def NodePrepareResources(self, request: PrepareRequest, context: grpc.ServicerContext) -> PrepareResponse:
        response: PrepareResponse = self.pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            answer = response.claims[claim.uid]
            devices = self._call("prepare", self.driver.prepare, claim, answer)
            for d in devices or ():
                # The kubelet matches a container's `request` against these names: a firstAvailable
                # result "r/sub" is reported as "r", as the kubelet plugin helper does
                # (k8s.io/dynamic-resource-allocation v0.36 kubeletplugin/draplugin.go, stripSubrequestNames).
                names = [n.split("/", 1)[0] for n in d.request_names]
                device = answer.devices.add(request_names=names, pool_name=d.pool_name,
                                            device_name=d.device_name, cdi_device_ids=d.cdi_device_ids)
                if self.has_share_id and d.share_id:
                    device.share_id = d.share_id  # type: ignore[union-attr]  # has_share_id: v1 only
        return response

    def NodeUnprepareResources(self, request: UnprepareRequest, context: grpc.ServicerContext) -> UnprepareResponse:
        response: UnprepareResponse = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            self._call("unprepare", self.driver.unprepare, claim, response.claims[claim.uid])
        return response

    def _call(self, operation: str, func: Callable[[str, str, str], _Result], claim: Claim,
              answer: ClaimAnswer) -> _Result | None:
        start = time.monotonic()
        ok = False
        try:
            result = func(claim.namespace, claim.name, claim.uid)
            ok = True
            return result
        except ClaimError as e:
            answer.error = str(e)
            log.error(f"{operation} failed", claim=f"{claim.namespace}/{claim.name}", uid=claim.uid[:80],
                      step=operation, error=str(e))
        except Exception as e:  # a bug or an unexpected OS error: still only this claim's failure
            answer.error = f"internal error: {type(e).__name__}: {e}"
            log.exception(f"{operation} failed unexpectedly", claim=f"{claim.namespace}/{claim.name}",
                          uid=claim.uid[:80], step=operation)
        finally:
            self.metrics.observe(operation, time.monotonic() - start, ok)
        return None


def add_dra_services(server: grpc.Server, driver: Driver, metrics: Metrics) -> None:
    # The generated *_pb2_grpc modules carry no annotations (protoc writes .pyi stubs only for messages).
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
        DraServicer(driver, dra_v1_pb2, metrics), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
        DraServicer(driver, dra_v1beta1_pb2, metrics), server)
