"""allocate_and_reserve(): the allocator run against a real API server (or the emulator).

Reads and writes raw JSON (`_preload_content=False`) so every field the server sends, known
to this client version or not, survives the round trip.
"""

from __future__ import annotations

from kubernetes.client import ApiClient, ResourceV1Api
from kubernetes.client.exceptions import ApiException

from dra_driver.kube import JSON, json_body, plain

from ..objects import list_all
from .core import AllocationError, allocate_claims, pod_reference

MAX_CONFLICTS = 5  # status writes retried after a 409 (someone else changed the claim)


def _allocated_node(allocation: JSON) -> list[str]:
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    return [v for t in terms for f in t.get("matchFields") or [] if f.get("key") == "metadata.name"
            for v in f.get("values") or []]


def allocate_on_node(api_client: ApiClient, claim: JSON, node_name: str, pod: JSON | None = None) -> JSON:
    """The status allocate() gives the claim on the node, next to the claims allocated now; writes
    nothing (the scheduler's Filter: a claim not yet in the API server can be tried too)."""
    return allocate_together(api_client, [claim], node_name, pod)[0]


def allocate_together(api_client: ApiClient, claims: list[JSON], node_name: str,
                      pod: JSON | None = None) -> list[JSON]:
    """The statuses allocate_claims() gives a pod's unallocated claims on the node, found in one
    search (a later claim may undo an earlier one's pick), next to the claims allocated now;
    writes nothing (the scheduler's Filter)."""
    api = ResourceV1Api(api_client)
    slices = [s for s in list_all(api.list_resource_slice)
              if s["spec"].get("nodeName") == node_name or s["spec"]["pool"]["name"] == node_name]
    allocated = [c for c in list_all(api.list_resource_claim_for_all_namespaces)
                 if (c.get("status") or {}).get("allocation")]
    return allocate_claims(claims, node_name=node_name, slices=slices,
                           device_classes=list_all(api.list_device_class), allocated_claims=allocated, pod=pod)


def allocate_and_reserve(api_client: ApiClient, namespace: str, claim_name: str, node_name: str,
                         pod: JSON | None = None, planned: JSON | None = None) -> JSON:
    """Allocate the claim on the node (unless it already is) and reserve it for the pod.
    `planned`: the allocation a Filter found for it beside the pod's other claims
    (allocate_together), written as it is; without it the claim is allocated alone.

    Returns the claim as written. Raises AllocationError when it does not fit, or when it is
    already allocated for another node.
    """
    api = ResourceV1Api(api_client)
    for _ in range(MAX_CONFLICTS + 1):
        claim = json_body(api.read_namespaced_resource_claim(claim_name, namespace, _preload_content=False))
        status = claim.setdefault("status", {})
        if status.get("allocation"):
            nodes = _allocated_node(status["allocation"])
            if nodes and node_name not in nodes:
                raise AllocationError(f"claim {namespace}/{claim_name} is allocated for node(s) {nodes}, "
                                      f"not {node_name!r}")
            reserved = status.setdefault("reservedFor", [])
            if not pod or any(r.get("uid") == pod["metadata"]["uid"] for r in reserved):
                return claim  # nothing to write
            reserved.append(pod_reference(pod))
        else:
            status.update({"allocation": planned, "reservedFor": [pod_reference(pod)] if pod else []}
                          if planned else allocate_on_node(api_client, claim, node_name, pod))
        try:
            return json_body(api.replace_namespaced_resource_claim_status(claim_name, namespace, plain(claim),
                                                                           _preload_content=False))
        except ApiException as e:
            if e.status != 409:
                raise
    raise AllocationError(f"claim {namespace}/{claim_name}: status kept changing under us ({MAX_CONFLICTS} conflicts)")
