"""One scenario of the node's claim status writer (kubeletplugin/agent/status.py), run against
the API emulator (tests/kubeletplugin/test_claim_status.py) and a real kube-apiserver
(tests/cluster): another driver's entries in status.devices stay through our writes, a
condition comes and goes with our entry's, ours go at Unprepare, and a recreated claim gets
none of the old one's."""
from __future__ import annotations

import uuid

from kubernetes import client

from kubeletplugin.agent.shares import Share
from kubeletplugin.agent.status import StatusWriter, kernels_too_long
from kubeletplugin.prepared import PreparedClaim, PreparedDevice, PreparedGpu

from . import wait_for

DRIVER = "gpushare.dev"
OTHER = "other.example.com"  # another DRA driver with a device in the same claim
POOL = "node-a"
OTHER_DATA = {"mac": "02:00:00:00:00:01"}
CONDITION = kernels_too_long(Share(limit=0.1, burst=False, charged=0.5, kernel_us=16_620, length_us=100_000,
                                   period_us=1_000_000), "2026-11-26T07:40:00Z")


def allocated_claim(r: client.ResourceV1Api, ns: str, name: str) -> str:
    """A claim allocated a device of ours and one of OTHER's, with OTHER's status entry written
    by its own server-side apply; its uid."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpushare.dev"}}]}}}
    uid = r.create_namespaced_resource_claim(ns, body).metadata.uid
    results = [{"request": "gpu", "driver": DRIVER, "pool": POOL, "device": "gpu-0"},
               {"request": "gpu", "driver": OTHER, "pool": "p", "device": "nic-0"}]
    r.patch_namespaced_resource_claim_status(name, ns, {"status": {"allocation": {"devices": {"results": results}}}},
                                             _content_type="application/merge-patch+json")
    other = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": ns},
             "status": {"devices": [{"driver": OTHER, "pool": "p", "device": "nic-0", "data": OTHER_DATA}]}}
    r.patch_namespaced_resource_claim_status(name, ns, other, field_manager=OTHER,
                                             _content_type="application/apply-patch+yaml")
    return uid


def entries(r: client.ResourceV1Api, ns: str, name: str) -> dict[str, dict]:
    claim = r.api_client.sanitize_for_serialization(r.read_namespaced_resource_claim(name, ns))
    return {d["driver"]: d for d in (claim.get("status") or {}).get("devices") or []}


def check_status_writer(api: client.ApiClient, ns: str = "default") -> None:
    r = client.ResourceV1Api(api)
    name = f"status-{uuid.uuid4().hex[:8]}"
    uid = allocated_claim(r, ns, name)
    prepared = PreparedClaim(ns, name, uid, (PreparedGpu(0, "GPU-0", 0, 1 << 30, 50),),
                             (PreparedDevice(("gpu",), POOL, "gpu-0"),))
    writer = StatusWriter(api, DRIVER).start()
    try:
        writer.prepared(prepared)
        ours = wait_for(lambda: entries(r, ns, name).get(DRIVER), what="our status entry")
        assert ours["data"]["computeLimit"] == 50 and ours["data"]["uuid"] == "GPU-0", ours
        assert entries(r, ns, name)[OTHER]["data"] == OTHER_DATA, "the other driver's entry"

        writer.prepared(prepared, {0: CONDITION})  # the condition of the device's GPU (host index 0)
        wait_for(lambda: entries(r, ns, name)[DRIVER].get("conditions"), what="our condition")
        (got,) = entries(r, ns, name)[DRIVER]["conditions"]
        when = got.pop("lastTransitionTime")  # read back as a datetime: its text form is the client's
        assert got == {k: v for k, v in CONDITION.items() if k != "lastTransitionTime"}, got
        assert when.startswith("2026-11-26T07:40:00"), when
        writer.prepared(prepared)  # without it: gone
        wait_for(lambda: not entries(r, ns, name)[DRIVER].get("conditions"), what="our condition gone")

        writer.unprepared(prepared)
        wait_for(lambda: DRIVER not in entries(r, ns, name), what="our entry gone after Unprepare")
        assert entries(r, ns, name)[OTHER]["data"] == OTHER_DATA, "the other driver's entry"

        r.delete_namespaced_resource_claim(name, ns)  # recreated under the same name: a new uid
        wait_for(lambda: name not in {c.metadata.name for c in r.list_namespaced_resource_claim(ns).items},
                 what="the claim deleted")
        allocated_claim(r, ns, name)
        writer.prepared(prepared)  # the old claim's, late
        wait_for(lambda: writer.pending == 0, what="the write done (refused: not retried)")
        assert DRIVER not in entries(r, ns, name), "the old claim's entry written into the new one"
    finally:
        writer.stop()
        try:
            r.delete_namespaced_resource_claim(name, ns)
        except client.ApiException:
            pass
