"""`gpushare-dra playground` with the real kubectl: every example under deploy/examples applied,
its pods Running with their claims allocated, reserved and prepared, then deleted and unprepared.

The playground runs as a user starts it (its own process, `--kubeconfig-out`), containers as
host processes (`--runtime process`: no podman needed, and fast); kubectl only ever uses the
kubeconfig it wrote.
"""

import json
from pathlib import Path

import pytest
import yaml

from playground.claimcontroller import POD_CLAIM_ANNOTATION, generate_name
from tests.support.kubectl import needs_kubectl
from tests.support.playground import NODE, applied, meminfo, objects, playground, pod_events, prepared, wait_for

ROOT = Path(__file__).parents[2]
# Every example that runs beside the others on 2 GPUs in capacity mode: extended-resources/ takes
# a whole GPU or needs partition mode (tests below and test_playground_partition.py run them),
# partition/ partition mode, mps/ and latency/ a GPU that serves MPS claims
# (test_playground_mps.py), health-taints/ a whole GPU, mig/ a GPU in MIG mode
# (test_playground_mig.py); tests/cluster/test_examples.py runs each.
EXAMPLES = sorted(p for p in (ROOT / "deploy" / "examples").glob("**/*.yaml")
                  if not {"extended-resources", "partition", "mps", "latency", "health-taints", "mig"} & set(p.parts))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(kubectl, the node's workdir) for a playground process on 2 x 80Gi simulated GPUs."""
    with playground(tmp_path_factory.mktemp("playground")) as started:
        yield started


@needs_kubectl
def test_examples_run_and_delete_cleanly(cluster):
    kubectl, node_dir = cluster
    files = [a for p in EXAMPLES for a in ("-f", p)]
    kubectl("apply", *files)
    pods = {d["metadata"]["name"] for p in EXAMPLES for d in yaml.safe_load_all(p.read_text())
            if d and d["kind"] == "Pod"}
    assert len(pods) == 7, pods  # the README's three, first-available's, the e2e scenario's three

    def all_running():
        items = objects(kubectl, "pods")
        return items if {p["metadata"]["name"] for p in items if p["status"].get("phase") == "Running"} == pods \
            else None

    running = {p["metadata"]["name"]: p for p in wait_for("every example pod Running", all_running)}
    claims = {c["metadata"]["name"]: c for c in objects(kubectl, "resourceclaims")}
    for name, pod in running.items():
        assert pod["spec"]["nodeName"] == NODE, name
        assert all(c["state"].get("running") for c in pod["status"]["containerStatuses"]), pod["status"]
    # trainer's claim came from its template, as the resourceclaim controller names and marks it.
    generated = running["trainer"]["status"]["resourceClaimStatuses"]
    assert [s["name"] for s in generated] == ["gpu"]
    claim = claims[generated[0]["resourceClaimName"]]
    assert claim["metadata"]["name"].startswith(generate_name("trainer", "gpu"))
    assert claim["metadata"]["annotations"][POD_CLAIM_ANNOTATION] == "gpu"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == running["trainer"]["metadata"]["uid"]

    # Every claim a pod uses is allocated on the node, reserved for exactly its pods, and prepared.
    users: dict[str, set[str]] = {}
    for pod in running.values():
        from_templates = {s["name"]: s["resourceClaimName"] for s in pod["status"].get("resourceClaimStatuses") or []}
        for pod_claim in pod["spec"]["resourceClaims"]:
            claim_name = pod_claim.get("resourceClaimName") or from_templates[pod_claim["name"]]
            users.setdefault(claim_name, set()).add(pod["metadata"]["uid"])
    for claim_name, pod_uids in users.items():
        status = claims[claim_name]["status"]
        (result,) = status["allocation"]["devices"]["results"]
        assert result["pool"] == NODE and result["consumedCapacity"], status
        assert {r["uid"] for r in status["reservedFor"]} == pod_uids, status
        assert "resource.kubernetes.io/delete-protection" in claims[claim_name]["metadata"]["finalizers"]
    assert {claims[n]["metadata"]["uid"] for n in users} == prepared(node_dir)
    # Claims no pod uses stay pending, as with the scheduler: allocation waits for a consumer.
    assert set(claims) - set(users) == {"whole-gpu"}
    assert not claims["whole-gpu"].get("status", {}).get("allocation")

    # What the containers did: kubectl logs, and the Events on the way.
    assert "GPU 0: " in wait_for("trainer's nvidia-smi -L", lambda: kubectl("logs", "trainer"))
    assert "result=oom" in wait_for("other's probe ran out of its 2Gi",
                                    lambda: "result=" in (out := kubectl("logs", "other")) and out)
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in objects(kubectl, "events")}
    assert {(p, r) for p in pods for r in ("Scheduled", "Started")} <= reasons, reasons

    kubectl("delete", *files)
    wait_for("every claim unprepared (CDI spec and claim folder gone)", lambda: not prepared(node_dir))
    wait_for("every claim deleted (the generated one too)", lambda: not objects(kubectl, "resourceclaims"))


@needs_kubectl
def test_a_claim_that_does_not_fit_leaves_its_pod_pending_with_the_reason(cluster):
    kubectl, _ = cluster
    manifest = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: too-big}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpushare.dev
        capacity: {requests: {memory: 100Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: too-big}
spec:
  resourceClaims: [{name: gpu, resourceClaimName: too-big}]
  containers:
  - {name: c, image: x, command: [sleep, infinity], resources: {claims: [{name: gpu}]}}
"""
    with applied(kubectl, manifest):
        (message,) = wait_for("a FailedScheduling Event", lambda: pod_events(kubectl, "too-big", "FailedScheduling"))
        assert "memory" in message and "100Gi" in message, message
        pod = json.loads(kubectl("get", "pod", "too-big", "-o", "json"))
        assert not pod["spec"].get("nodeName") and pod["status"].get("phase", "Pending") == "Pending"
        (scheduled,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
        claim = json.loads(kubectl("get", "resourceclaim", "too-big", "-o", "json"))
        assert not claim.get("status", {}).get("allocation"), claim["status"]


@needs_kubectl
def test_a_missing_template_is_an_event_naming_it(cluster):
    kubectl, _ = cluster
    manifest = """
apiVersion: v1
kind: Pod
metadata: {name: no-template}
spec:
  resourceClaims: [{name: gpu, resourceClaimTemplateName: nowhere}]
  containers:
  - {name: c, image: x, command: [sleep, infinity], resources: {claims: [{name: gpu}]}}
"""
    with applied(kubectl, manifest):
        def events(reason):
            return pod_events(kubectl, "no-template", reason)

        (message,) = wait_for("a FailedResourceClaimCreation Event", lambda: events("FailedResourceClaimCreation"))
        assert message == ('PodResourceClaim gpu: resource claim template "nowhere": '
                           'resourceclaimtemplate.resource.k8s.io "nowhere" not found'), message
        (waiting,) = wait_for("a FailedScheduling Event", lambda: events("FailedScheduling"))
        assert "gpu" in waiting and "created" in waiting, waiting


def test_generated_claim_names_are_shortened_as_upstream():
    assert generate_name("trainer", "gpu") == "trainer-gpu-"
    # Past 57 characters both parts shrink in proportion (60 and 20 of 82): the claim's name survives.
    assert generate_name("p" * 60, "claim" * 4) == "p" * 41 + "-" + "claimclaimcla"


@needs_kubectl
def test_first_available_falls_through_to_its_second_choice(cluster):
    """Both GPUs keep 10Gi free: the 20Gi share does not fit, the 10Gi share does; the container,
    which names only the request `gpu`, gets that device with the 10Gi limit."""
    kubectl, node_dir = cluster
    fillers = "---".join(f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: filler-{i}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpushare.dev
        capacity: {{requests: {{memory: 70Gi, compute: "10"}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: filler-{i}}}
spec:
  resourceClaims: [{{name: gpu, resourceClaimName: filler-{i}}}]
  containers:
  - {{name: c, image: x, command: [sleep, infinity], resources: {{claims: [{{name: gpu}}]}}}}
""" for i in (0, 1))
    example = ROOT / "deploy/examples/first-available/first-available.yaml"
    kubectl("apply", "-f", "-", input=fillers)
    try:
        wait_for("both fillers Running", lambda: [p["status"].get("phase") for p in objects(kubectl, "pods")]
                 == ["Running", "Running"])
        kubectl("apply", "-f", example)
        pod = wait_for("flexible Running", lambda: next((p for p in objects(kubectl, "pods")
                                                         if p["metadata"]["name"] == "flexible"
                                                         and p["status"].get("phase") == "Running"), None))
        claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        claim = json.loads(kubectl("get", "resourceclaim", claim_name, "-o", "json"))
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["request"] == "gpu/share-10gi", result
        assert result["consumedCapacity"]["memory"] == "10Gi", result
        info = wait_for("flexible's meminfo", lambda: meminfo(kubectl("logs", "flexible")))
        assert info["cu_total"] == str(10 << 30), info  # the second choice's limit, enforced
    finally:
        kubectl("delete", "--ignore-not-found", "-f", example)
        kubectl("delete", "-f", "-", input=fillers)
    wait_for("every claim unprepared", lambda: not prepared(node_dir))


@needs_kubectl
def test_a_pod_with_only_a_gpu_limit_gets_a_whole_gpu(cluster):
    """gpushare.dev/gpu in resources.limits, no claim: the scheduler's claim takes a capacity-mode
    GPU whole (nothing asked: compute's default is all of it, so nobody shares the GPU, and the
    plugin gives it all the memory though the scheduler books the memory default); it goes with the pod."""
    kubectl, node_dir = cluster
    example = ROOT / "deploy/examples/extended-resources/whole-gpu.yaml"
    kubectl("apply", "-f", example)
    try:
        pod = wait_for("whole-gpu-pod Running", lambda: next((p for p in objects(kubectl, "pods")
                                                              if p["status"].get("phase") == "Running"), None))
        special = pod["status"]["extendedResourceClaimStatus"]
        assert special["requestMappings"] == [{"containerName": "app", "resourceName": "gpushare.dev/gpu",
                                               "requestName": "container-0-request-0"}]
        claim = json.loads(kubectl("get", "resourceclaim", special["resourceClaimName"], "-o", "json"))
        assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.gpushare.dev"
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-0" and result["consumedCapacity"] == {"memory": "10Gi", "compute": "100"}, \
            result
        info = wait_for("whole-gpu-pod's meminfo", lambda: meminfo(kubectl("logs", "whole-gpu-pod")))
        assert info["cu_total"] == str(80 << 30), info  # all of the 80Gi GPU
    finally:
        kubectl("delete", "--ignore-not-found", "-f", example)
    wait_for("the claim unprepared", lambda: not prepared(node_dir))
    wait_for("the claim deleted with its pod", lambda: not objects(kubectl, "resourceclaims"))
