"""`gpushare-dra playground --sharing-mode partition` with the real kubectl: a pod that asks
for `gpushare.dev/share` in resources.limits and writes no claim (deploy/examples/extended-resources/share.yaml)
gets the claim kube-scheduler writes for it, runs with the share's limits enforced, and the
claim goes with the pod."""

import json
from pathlib import Path

import pytest

from playground.extended import CLAIM_ANNOTATION
from tests.support.kubectl import needs_kubectl
from tests.support.playground import NODE, applied, meminfo, objects, playground, pod_events, prepared, wait_for

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "deploy/examples/extended-resources/share.yaml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with playground(tmp_path_factory.mktemp("partition"), "--sharing-mode", "partition") as started:
        yield started


@needs_kubectl
def test_a_pod_with_only_limits_gets_an_enforced_share_and_its_claim_goes_with_it(cluster):
    kubectl, node_dir = cluster
    kubectl("apply", "-f", EXAMPLE)
    pod = wait_for("share-pod Running", lambda: next((p for p in objects(kubectl, "pods")
                                                      if p["status"].get("phase") == "Running"), None))
    meta, status = pod["metadata"], pod["status"]
    assert pod["spec"]["nodeName"] == NODE and not pod["spec"].get("resourceClaims")
    # The API server defaulted requests from limits: what the scheduler reads.
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"gpushare.dev/share": "1"}
    special = status["extendedResourceClaimStatus"]
    assert special["requestMappings"] == [{"containerName": "app", "resourceName": "gpushare.dev/share",
                                           "requestName": "container-0-request-0"}]
    claim = json.loads(kubectl("get", "resourceclaim", special["resourceClaimName"], "-o", "json"))
    cmeta = claim["metadata"]
    assert cmeta["name"].startswith("share-pod-extended-resources-")
    assert cmeta["annotations"][CLAIM_ANNOTATION] == "true"
    assert [(o["kind"], o["name"], o["uid"], o["controller"]) for o in cmeta["ownerReferences"]] == [
        ("Pod", "share-pod", meta["uid"], True)]
    assert claim["spec"]["devices"]["requests"] == [{"name": "container-0-request-0", "exactly": {
        "deviceClassName": "share.gpushare.dev", "allocationMode": "ExactCount", "count": 1}}]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["request"], result["device"]) == ("container-0-request-0", "gpu-0-share-0"), result
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [meta["uid"]]
    assert prepared(node_dir) == {cmeta["uid"]}

    # Enforced: CUDA and NVML in the container show one share, 80Gi / 8.
    info = wait_for("share-pod's meminfo", lambda: meminfo(kubectl("logs", "share-pod")))
    assert info["cu_total"] == str(10 << 30), info

    kubectl("delete", "-f", EXAMPLE)
    wait_for("the claim unprepared", lambda: not prepared(node_dir))
    wait_for("the claim deleted with its pod", lambda: not objects(kubectl, "resourceclaims"))


@needs_kubectl
def test_what_cannot_be_had_leaves_the_pod_pending_with_the_reason(cluster):
    """A whole GPU (gpushare.dev/gpu: capacity-mode devices) on a partition-mode node, and a
    resource neither a device plugin nor a DeviceClass provides: FailedScheduling, no claim."""
    kubectl, _ = cluster
    manifest = """
apiVersion: v1
kind: Pod
metadata: {name: wants-whole-gpu}
spec:
  containers:
  - {name: c, image: x, command: [sleep, infinity], resources: {limits: {gpushare.dev/gpu: 1}}}
---
apiVersion: v1
kind: Pod
metadata: {name: wants-unknown}
spec:
  containers:
  - {name: c, image: x, command: [sleep, infinity], resources: {limits: {example.com/fpga: 1}}}
"""
    with applied(kubectl, manifest):
        (whole,) = wait_for("wants-whole-gpu's FailedScheduling",
                            lambda: pod_events(kubectl, "wants-whole-gpu", "FailedScheduling"))
        assert "container-0-request-0" in whole and "cannot allocate" in whole, whole
        (unknown,) = wait_for("wants-unknown's FailedScheduling",
                              lambda: pod_events(kubectl, "wants-unknown", "FailedScheduling"))
        assert unknown == "0/1 nodes are available: 1 Insufficient example.com/fpga.", unknown
        assert not objects(kubectl, "resourceclaims")  # tried in memory: nothing written


@needs_kubectl
def test_bad_extended_resource_requests_are_refused_naming_the_field(cluster):
    kubectl, _ = cluster
    manifest = """
apiVersion: v1
kind: Pod
metadata: {name: half-share}
spec:
  containers:
  - {name: c, image: x, command: [sleep, infinity], resources: {limits: {gpushare.dev/share: 500m}}}
"""
    result = kubectl.run("apply", "-f", "-", input=manifest, check=False)
    out = result.stderr
    field = "spec.containers[0].resources.limits[gpushare.dev/share]"
    assert result.returncode != 0 and field in out and "must be an integer" in out, out
