"""Test helpers: a kubelet stand-in over the plugin's real unix sockets, and claims as the
scheduler leaves them (created through the real client, allocation patched into status)."""

from __future__ import annotations

import uuid

from kubernetes import client

from dra_driver.playground.kubelet import Kubelet  # noqa: F401  (re-exported for the tests)

DRIVER = "gpushare.dev"
NODE = "node-a"
NAMESPACE = "default"
GiB = 1 << 30


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
