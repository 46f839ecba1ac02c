"""NoGpuFits: a Warning Event on a claim that no GPU can hold now, naming each GPU's free memory
and compute (dra_driver/controller/pending.py), recorded by one node's controller, once per
change. Against the API emulator (the real cluster: tests/cluster/test_cluster.py)."""

from __future__ import annotations

import datetime
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

from dra_driver.controller.pending import REASON, PendingClaims

DRIVER = "gpushare.dev"


def capacity_slice(node: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpus"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "allowMultipleAllocations": True, "capacity": {
                         "memory": {"value": "80Gi", "requestPolicy": {"default": "10Gi"}},
                         "compute": {"value": "100"}}}]}}


def claim(resource: client.ResourceV1Api, name: str, memory: str, compute: str) -> None:
    resource.create_namespaced_resource_claim("default", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "capacity": {
            "requests": {"memory": memory, "compute": compute}}}}]}}})


def allocate(resource: client.ResourceV1Api, name: str, node: str, memory: str, compute: str) -> None:
    results = [{"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0",
                "consumedCapacity": {"memory": memory, "compute": compute}}]
    resource.patch_namespaced_resource_claim_status(name, "default", {
        "status": {"allocation": {"devices": {"results": results}}}})


def events(api: client.ApiClient, name: str) -> list[str]:
    items = client.CoreV1Api(api).list_namespaced_event("default").items
    return [e.message for e in items if e.involved_object.name == name and e.reason == REASON]


def test_a_claim_no_gpu_holds_now_gets_one_event_from_one_node(emulator):
    api = emulator.api_client()
    resource = client.ResourceV1Api(api)
    for node in ("node-b", "node-a"):
        resource.create_resource_slice(capacity_slice(node))
    for node in ("node-a", "node-b"):
        claim(resource, f"held-{node}", "70Gi", "50")
        allocate(resource, f"held-{node}", node, "70Gi", "50")
    claim(resource, "big", "20Gi", "10")  # fits an 80Gi GPU, but neither has 20Gi free
    claim(resource, "small", "4Gi", "10")  # fits: no Event
    later = lambda: datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=1)  # noqa: E731
    assert PendingClaims(api, DRIVER, "node-b", now=later).pass_once() == 0  # node-a writes them
    writer = PendingClaims(api, DRIVER, "node-a", now=later)
    assert writer.pass_once() == 1
    assert events(api, "big") == [
        "no GPU of gpushare.dev can hold the claim now: request 'gpu' asks memory 20Gi, compute 10; node-a gpu-0: "
        "memory 10Gi free of 80Gi, compute 50 free of 100 (memory 20Gi asked, 10Gi free); node-b gpu-0: memory "
        "10Gi free of 80Gi, compute 50 free of 100 (memory 20Gi asked, 10Gi free) (gpushare-dra explain shows it "
        "again)"]
    assert events(api, "small") == []
    assert writer.pass_once() == 0  # nothing changed: not again
    allocate(resource, "small", "node-a", "4Gi", "10")  # node-a now has less: the message changes
    assert writer.pass_once() == 1 and len(events(api, "big")) == 2
    # claims just made (here: all of them, seen 1 minute before now) are left to the scheduler's first try
    earlier = lambda: datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)  # noqa: E731
    assert PendingClaims(api, DRIVER, "node-a", now=earlier).pass_once() == 0


def test_a_node_that_does_not_write_asks_for_one_slice_only(emulator):
    """Every node looks every 5 minutes whether it became the writer: one slice's worth, not the
    fleet's slices (1,000 nodes' lists of every slice cost the API server more than the fleet's
    publishing; docs/fleet.md)."""
    api = emulator.api_client()
    resource = client.ResourceV1Api(api)
    for node in ("node-c", "node-a", "node-b"):
        resource.create_resource_slice(capacity_slice(node))
    sent = []
    request = api.rest_client.request
    api.rest_client.request = lambda method, url, *a, **kw: sent.append((method, url)) or request(method, url, *a, **kw)
    asked = lambda: [(urlsplit(url).path.rsplit("/", 1)[1], parse_qs(urlsplit(url).query).get("limit"))  # noqa: E731
                     for method, url in sent]
    assert PendingClaims(api, DRIVER, "node-b").pass_once() == 0
    assert asked() == [("resourceslices", ["1"])], sent
    # The writer learns it writes from the first slice, then lists them all and the claims; from
    # then on it lists every slice at once (it needs them all): 2 requests a look, as before.
    writer = PendingClaims(api, DRIVER, "node-a")
    sent.clear()
    writer.pass_once()
    assert asked() == [("resourceslices", ["1"]), ("resourceslices", None), ("resourceclaims", None)], sent
    sent.clear()
    writer.pass_once()
    assert asked() == [("resourceslices", None), ("resourceclaims", None)], sent
