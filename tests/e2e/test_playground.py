"""`gpushare-dra playground` with the real kubectl: every example under deploy/examples applied,
its pods Running with their claims allocated, reserved and prepared, then deleted and unprepared.

The playground runs as a user starts it (its own process, `--kubeconfig-out`), containers as
host processes (`--runtime process`: no podman needed, and fast); kubectl only ever uses the
kubeconfig it wrote.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dra_driver.playground.claimcontroller import POD_CLAIM_ANNOTATION, generate_name
from tests.support.kubectl import Kubectl, needs_kubectl

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("**/*.yaml"))
NODE = "playground-node"
DEADLINE_S = 40  # a loaded machine; the whole test takes a few seconds


def wait_for(what: str, probe):
    """probe() until it returns something truthy; fails naming `what` and the last value."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            assert value, f"{what}: not after {DEADLINE_S}s"
            return value
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(kubectl, the node's workdir) for a playground process on 2 x 80Gi simulated GPUs."""
    work = tmp_path_factory.mktemp("playground")
    kubeconfig, node_dir = work / "playground.kubeconfig", work / "node"
    proc = subprocess.Popen([sys.executable, "-m", "dra_driver.cli", "playground", "--port", "0",
                             "--kubeconfig-out", str(kubeconfig), "--workdir", str(node_dir), "--runtime", "process",
                             "--node-name", NODE,
                             "--log-format", "json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # imports and the plugin's start take seconds on a loaded machine
        while not kubeconfig.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert kubeconfig.exists(), f"the playground wrote no kubeconfig: {proc.stderr.read() if proc.poll() else ''}"
        yield Kubectl(work, kubeconfig=kubeconfig), node_dir
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def objects(kubectl, kind: str) -> list[dict]:
    return json.loads(kubectl("get", kind, "-o", "json"))["items"]


def prepared(node_dir: Path) -> set[str]:
    """Claim uids with a CDI spec or a claim folder on the node."""
    specs = {p.stem.split("_", 1)[1] for p in (node_dir / "cdi").glob("k8s.gpushare.dev-claim_*.json")}
    folders = {p.name for p in (node_dir / "state" / "claims").glob("*")}
    return specs | folders


@needs_kubectl
def test_examples_run_and_delete_cleanly(cluster):
    kubectl, node_dir = cluster
    files = [a for p in EXAMPLES for a in ("-f", p)]
    kubectl("apply", *files)
    pods = {d["metadata"]["name"] for p in EXAMPLES for d in yaml.safe_load_all(p.read_text())
            if d and d["kind"] == "Pod"}
    assert len(pods) == 6, pods  # the README's three and the e2e scenario's three

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
        for pod_claim in pod["spec"]["resourceClaims"]:
            claim_name = pod_claim.get("resourceClaimName") or generated[0]["resourceClaimName"]
            users.setdefault(claim_name, set()).add(pod["metadata"]["uid"])
    for claim_name, pod_uids in users.items():
        status = claims[claim_name]["status"]
        (result,) = status["allocation"]["devices"]["results"]
        assert result["pool"] == NODE and result["consumedCapacity"], status
        assert {r["uid"] for r in status["reservedFor"]} == pod_uids, status
        assert "resource.kubernetes.io/delete-protection" in claims[claim_name]["metadata"]["finalizers"]
    assert {claims[n]["metadata"]["uid"] for n in users} == prepared(node_dir)
    # Claims no pod uses stay pending, as with the scheduler: allocation waits for a consumer.
    assert set(claims) - set(users) == {"whole-gpu", "two-shares"}
    assert not any(claims[n].get("status", {}).get("allocation") for n in ("whole-gpu", "two-shares"))

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
    kubectl("apply", "-f", "-", input=manifest)
    try:
        def failed_scheduling():
            return [e["message"] for e in objects(kubectl, "events")
                    if e["involvedObject"]["name"] == "too-big" and e["reason"] == "FailedScheduling"]

        (message,) = wait_for("a FailedScheduling Event", failed_scheduling)
        assert "memory" in message and "100Gi" in message, message
        pod = json.loads(kubectl("get", "pod", "too-big", "-o", "json"))
        assert not pod["spec"].get("nodeName") and pod["status"].get("phase", "Pending") == "Pending"
        (scheduled,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
        claim = json.loads(kubectl("get", "resourceclaim", "too-big", "-o", "json"))
        assert not claim.get("status", {}).get("allocation"), claim["status"]
    finally:
        kubectl("delete", "-f", "-", input=manifest)


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
    kubectl("apply", "-f", "-", input=manifest)
    try:
        def events(reason):
            return [e["message"] for e in objects(kubectl, "events")
                    if e["involvedObject"]["name"] == "no-template" and e["reason"] == reason]

        (message,) = wait_for("a FailedResourceClaimCreation Event", lambda: events("FailedResourceClaimCreation"))
        assert message == ('PodResourceClaim gpu: resource claim template "nowhere": '
                           'resourceclaimtemplate.resource.k8s.io "nowhere" not found'), message
        (waiting,) = wait_for("a FailedScheduling Event", lambda: events("FailedScheduling"))
        assert "gpu" in waiting and "created" in waiting, waiting
    finally:
        kubectl("delete", "-f", "-", input=manifest)


def test_generated_claim_names_are_shortened_as_upstream():
    assert generate_name("trainer", "gpu") == "trainer-gpu-"
    # Past 57 characters both parts shrink in proportion (60 and 20 of 82): the claim's name survives.
    assert generate_name("p" * 60, "claim" * 4) == "p" * 41 + "-" + "claimclaimcla"
