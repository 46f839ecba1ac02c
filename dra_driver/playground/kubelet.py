"""The kubelet's side of the plugin's sockets: a stand-in for tests, benchmarks and the demo.

It speaks to the plugin exactly as the kubelet does: registration over
`<registry-dir>/<driver>-reg.sock`, DRA v1 or v1beta1 over `<plugin-dir>/dra.sock`, with
the generated stubs. Claims are (namespace, name, uid) tuples.
"""

from __future__ import annotations

import grpc

from kubeletplugin.grpcapi import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

_PB = {"v1": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}


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

    def prepare(self, *claims, version: str = "v1", timeout: float = 30):
        pb, pb_grpc = _PB[version]
        request = pb.NodePrepareResourcesRequest(claims=[pb.Claim(namespace=c[0], name=c[1], uid=c[2]) for c in claims])
        return pb_grpc.DRAPluginStub(self.dra).NodePrepareResources(request, timeout=timeout)

    def unprepare(self, *claims, version: str = "v1", timeout: float = 30):
        pb, pb_grpc = _PB[version]
        request = pb.NodeUnprepareResourcesRequest(claims=[pb.Claim(namespace=c[0], name=c[1], uid=c[2]) for c in claims])
        return pb_grpc.DRAPluginStub(self.dra).NodeUnprepareResources(request, timeout=timeout)
