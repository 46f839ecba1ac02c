"""ResourceClaims as the scheduler leaves them, for the tests and the benchmarks.

make_claim creates the claim through the real client (so the API server gives it its UID)
and patches an allocation into its status, as kube-scheduler would; result, opaque_config and
gpushare_config build the pieces of that allocation. A claim is named by
kubeletplugin.claimref.ClaimRef, the (namespace, name, uid) the kubelet sends to the plugin.
"""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes import client

from dra_driver.cli import DEFAULT_DRIVER_NAME
from dra_driver.config import KIND
from dra_driver.config.v1alpha1 import API_VERSION
from kubeletplugin.claimref import ClaimRef

DRIVER = DEFAULT_DRIVER_NAME
NODE = "node-a"
NAMESPACE = "default"


def result(device: str, request: str = "gpu", driver: str = DRIVER, pool: str = NODE, share_id: str | None = None,
           consumed: dict[str, str] | None = None) -> dict[str, Any]:
    """One entry of status.allocation.devices.results."""
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share_id:
        r["shareID"] = share_id
    if consumed:
        r["consumedCapacity"] = consumed
    return r


def opaque_config(params: dict[str, Any], requests: list[str] | None = None, source: str = "FromClaim",
                  driver: str = DRIVER) -> dict[str, Any]:
    """One entry of status.allocation.devices.config: opaque parameters for `driver`."""
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests:
        entry["requests"] = requests
    return entry


def gpushare_config(**fields: Any) -> dict[str, Any]:
    """A GpuShareConfig document with these fields (memoryLimit=..., computeLimit=...)."""
    return {"apiVersion": API_VERSION, "kind": KIND, **fields}


def make_claim(api: client.ApiClient, results: list[dict[str, Any]] | None, config: list[dict[str, Any]] | None = None,
               namespace: str = NAMESPACE, name: str | None = None) -> ClaimRef:
    """Create a ResourceClaim and, unless results is None, allocate it to those results."""
    name = name or f"claim-{uuid.uuid4().hex[:10]}"
    requests = sorted({r["request"] for r in results or []} or {"gpu"})
    body: Any = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": DRIVER}} for r in requests]}}}
    rapi = client.ResourceV1Api(api)  # takes the dict body as it is (Any: not the client's model type)
    created = rapi.create_namespaced_resource_claim(namespace, body)
    if results is not None:
        devices: dict[str, Any] = {"results": results}
        if config:
            devices["config"] = config
        rapi.patch_namespaced_resource_claim_status(name, namespace, {"status": {"allocation": {"devices": devices}}})
    meta = created.metadata
    assert meta is not None and meta.uid, f"the API server gave claim {namespace}/{name} no uid"
    return ClaimRef(namespace, name, meta.uid)
