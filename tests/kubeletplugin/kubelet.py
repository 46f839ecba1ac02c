"""Test helpers: a kubelet stand-in over the plugin's real unix sockets, and claims as the
scheduler leaves them (created through the real client, allocation patched into status)."""

from __future__ import annotations

import uuid

import grpc
from kubernetes import client

from kubeletplugin.grpcapi import (dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc,
                                   pluginregistration_pb2, pluginregistration_pb2_grpc)

DRIVER = "gpushare.dev"
NODE = "node-a"
NAMESPACE = "default"
GiB = 1 << 30

_PB = {"v1": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}


class Kubelet:
    def __init__(self, dra_socket: str, reg_socket: str):
        self.dra = grpc.insecure_channel(f"unix://{dra_socket}")
        self.reg = grpc.insecure_channel(f"unix://{reg_socket}")

    def close(self) -> None:
        self.dra.close()
        self.reg.close()

    def get_info(self):
        return pluginregistration_pb2_grpc.RegistrationStub(self.reg).GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)

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


def result(device: str, request: str = "gpu", driver: str = DRIVER, pool: str = NODE, share_id: str | None = None,
           consumed: dict | None = None) -> dict:
    r = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share_id:
        r["shareID"] = share_id
    if consumed:
        r["consumedCapacity"] = consumed
    return r


def opaque_config(params: dict, requests: list[str] | None = None, source: str = "FromClaim", driver: str = DRIVER) -> dict:
    entry = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests:
        entry["requests"] = requests
    return entry


def gpushare_config(**fields) -> dict:
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GpuShareConfig", **fields}


def make_claim(api: client.ApiClient, results: list[dict] | None, config: list[dict] | None = None,
               namespace: str = NAMESPACE, name: str | None = None) -> tuple[str, str, str]:
    """Create a ResourceClaim and, unless results is None, allocate it; returns (namespace, name, uid)."""
    name = name or f"claim-{uuid.uuid4().hex[:10]}"
    requests = sorted({r["request"] for r in results or []} or {"gpu"})
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": DRIVER}} for r in requests]}}}
    rapi = client.ResourceV1Api(api)
    created = rapi.create_namespaced_resource_claim(namespace, body)
    if results is not None:
        devices = {"results": results}
        if config:
            devices["config"] = config
        rapi.patch_namespaced_resource_claim_status(name, namespace, {"status": {"allocation": {"devices": devices}}})
    return namespace, name, created.metadata.uid
