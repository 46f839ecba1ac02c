"""A claim that asked for capacity and was prepared on partition devices gets a Warning Event
saying so: on a server without consumable capacity (the API server dropped the ask, which only
kubectl's last-applied-configuration still shows), and where the node publishes partitions."""

from __future__ import annotations

import json

import yaml
from kubernetes import client

from kubeletplugin.allocation import LAST_APPLIED, unmet_capacity
from kubeletplugin.claimref import ClaimRef
from kubeletplugin.prepared import PreparedGpu
from playground.claims import DRIVER, NODE, make_claim, result
from playground.kubelet import Kubelet
from tests.support import GiB, wait_for
from tests.support.kubectl import Kubectl, needs_kubectl
from tests.support.plugin import launch_plugin

GPU0 = (PreparedGpu(0, "GPU-0", 0, 10 * GiB, 12),)


def allocated(spec: dict, *results: dict, annotations: dict | None = None) -> dict:
    return {"metadata": {"annotations": annotations or {}}, "spec": spec,
            "status": {"allocation": {"devices": {"results": list(results)}}}}


def request(name: str = "gpu", **capacity: str) -> dict:
    return {"name": name, "exactly": {"deviceClassName": DRIVER,
                                      **({"capacity": {"requests": capacity}} if capacity else {})}}


def test_ask_seen_only_in_last_applied_was_dropped_by_the_api_server():
    sent = {"devices": {"requests": [request(memory="6Gi", compute="20")]}}
    claim = allocated({"devices": {"requests": [request()]}}, result("gpu-0-share-3"),
                      annotations={LAST_APPLIED: json.dumps({"kind": "ResourceClaim", "spec": sent})})
    assert unmet_capacity(claim, DRIVER, NODE, GPU0) == (
        "gpushare: request 'gpu' asked for capacity compute=20, memory=6Gi but the API server dropped it "
        "(feature gate DRAConsumableCapacity off); it got gpu-0-share-3 "
        "(the claim's limits: GPU 0: memory 10Gi, compute 12 %)")


def test_ask_kept_by_the_server_but_met_by_partition_devices():
    spec = {"devices": {"requests": [
        request("plain"),
        {"name": "any", "firstAvailable": [{"name": "big", "deviceClassName": DRIVER},
                                           {"name": "small", "deviceClassName": DRIVER,
                                            "capacity": {"requests": {"memory": "2Gi"}}}]}]}}
    claim = allocated(spec, result("gpu-0-share-0", request="plain"), result("gpu-0-share-1", request="any/small"))
    assert unmet_capacity(claim, DRIVER, NODE, GPU0) == (
        "gpushare: request 'any/small' asked for capacity memory=2Gi but this node publishes partition devices, "
        "fixed shares; it got gpu-0-share-1 (the claim's limits: GPU 0: memory 10Gi, compute 12 %)")


def test_nothing_to_say():
    asked = {"devices": {"requests": [request(memory="6Gi")]}}
    assert unmet_capacity(allocated(asked, result("gpu-0", consumed={"memory": "6Gi"})), DRIVER, NODE, GPU0) is None
    assert unmet_capacity(allocated({"devices": {"requests": [request()]}}, result("gpu-0-share-0")),
                          DRIVER, NODE, GPU0) is None  # asked for no capacity
    assert unmet_capacity(allocated(asked, result("gpu-0-share-0", driver="other.example.com")),
                          DRIVER, NODE, GPU0) is None  # not our device
    for record in ("not json", "[1, 2]", json.dumps({"spec": "odd"})):
        claim = allocated({}, result("gpu-0-share-0"), annotations={LAST_APPLIED: record})
        assert unmet_capacity(claim, DRIVER, NODE, GPU0) is None


@needs_kubectl
def test_claim_applied_to_a_server_without_consumable_capacity_gets_the_event(make_emulator, dirs, hook_dir,
                                                                              tmp_path):
    emu = make_emulator(consumable_capacity=False)
    api = emu.api_client()
    kubectl = Kubectl(tmp_path, kubeconfig=emu.write_kubeconfig(tmp_path / "kubeconfig"))
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "training"},
            "spec": {"devices": {"requests": [request(memory="6Gi", compute="20")]}}}
    kubectl("apply", "-n", "team-a", "-f", "-", input=yaml.safe_dump(body))
    rapi = client.ResourceV1Api(api)
    stored = rapi.read_namespaced_resource_claim("training", "team-a", _preload_content=False)
    assert "capacity" not in json.loads(stored.data)["spec"]["devices"]["requests"][0]["exactly"]  # dropped
    rapi.patch_namespaced_resource_claim_status("training", "team-a", {"status": {"allocation": {"devices": {
        "results": [result("gpu-1-share-2")]}}}})
    ref = ClaimRef("team-a", "training", json.loads(stored.data)["metadata"]["uid"])

    plugin = launch_plugin(api, dirs, hook_dir)  # 4x16Gi, 4 partitions: a share is 4Gi, 25 %
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    try:
        plain_ref = make_claim(api, [result("gpu-0-share-0")], namespace="team-a")  # asks for no capacity
        assert kubelet.prepare(plain_ref).claims[plain_ref.uid].error == ""
        assert kubelet.prepare(ref).claims[ref.uid].error == ""
        core = client.CoreV1Api(api)
        wait_for(lambda: core.list_namespaced_event("team-a", field_selector="involvedObject.name=training").items)
        [event] = core.list_namespaced_event("team-a").items  # none about the plain claim
    finally:
        kubelet.close()
        plugin.stop(grace=1)
    assert (event.involved_object.kind, event.involved_object.namespace, event.involved_object.name,
            event.involved_object.uid) == ("ResourceClaim", "team-a", "training", ref.uid)
    assert (event.type, event.reason, event.metadata.namespace) == ("Warning", "CapacityRequestDropped", "team-a")
    assert event.message == (
        "gpushare: request 'gpu' asked for capacity compute=20, memory=6Gi but the API server dropped it "
        "(feature gate DRAConsumableCapacity off); it got gpu-1-share-2 "
        "(the claim's limits: GPU 1: memory 4Gi, compute 25 %)")
    described = kubectl("describe", "resourceclaim", "-n", "team-a", "training")
    assert "CapacityRequestDropped" in described and "DRAConsumableCapacity off" in described
