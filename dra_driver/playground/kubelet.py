"""The kubelet's side of the plugin's sockets: a stand-in for tests, benchmarks, the demo and the playground.

It speaks to the plugin exactly as the kubelet does: registration over
`<registry-dir>/<driver>-reg.sock`, DRA v1 or v1beta1 over `<plugin-dir>/dra.sock`, with
the generated stubs. Claims are named by ClaimRef (namespace, name, uid), as the kubelet sends them.
"""

from __future__ import annotations

from typing import Any

import grpc

from kubeletplugin.claimref import ClaimRef
from kubeletplugin.grpcapi import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

_PB = {"v1": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}


def _claims(pb: Any, claims: tuple[ClaimRef, ...]) -> list[Any]:
    return [pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]


class Kubelet:
    def __init__(self, dra_socket: str, reg_socket: str):
        self.dra = grpc.insecure_channel(f"unix://{dra_socket}")
        self.reg = grpc.insecure_channel(f"unix://{reg_socket}")

    def close(self) -> None:
        self.dra.close()
        self.reg.close()

    def get_info(self):
        return pluginregistration_pb2_grpc.RegistrationStub(self.reg).GetInfo(
            pluginregistration_pb2.InfoRequest(), timeout=5)

    def notify(self, registered: bool, error: str = "") -> None:
        pluginregistration_pb2_grpc.RegistrationStub(self.reg).NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=registered, error=error), timeout=5)

    def prepare(self, *claims: ClaimRef, version: str = "v1", timeout: float = 30) -> Any:
        pb, pb_grpc = _PB[version]
        request = pb.NodePrepareResourcesRequest(claims=_claims(pb, claims))
        return pb_grpc.DRAPluginStub(self.dra).NodePrepareResources(request, timeout=timeout)

    def unprepare(self, *claims: ClaimRef, version: str = "v1", timeout: float = 30) -> Any:
        pb, pb_grpc = _PB[version]
        request = pb.NodeUnprepareResourcesRequest(claims=_claims(pb, claims))
        return pb_grpc.DRAPluginStub(self.dra).NodeUnprepareResources(request, timeout=timeout)
