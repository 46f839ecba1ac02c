"""Every folder of deploy/examples applied on the real one-node cluster and checked as its README
says, as dra-example-driver's demo/ does: the pods Running with what their claims give (the
probe's meminfo, tests/support/cluster.py `examples`), then deleted: each pod ends at SIGTERM
(its shell's trap), so the deletes take seconds, not the 30 s grace period.

(deploy/examples/e2e: test_cluster.py's budget test.) The product is the package's `installed`
kustomize install: this file runs before test_cluster.py, whose last test removes it
(tests/cluster/conftest.py ORDER).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support import GiB
from tests.support.cluster import Kube, examples

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]

DRIVER = "gpushare.dev"
DS = ["-n", "gpushare-system", "daemonset/gpushare-kubelet-plugin"]
# A pod that ends at SIGTERM is gone in a few seconds; one that ignores it waits out the grace
# period (30 s) and is killed.
DELETE_BOUND_S = 20
SIM_EVENTS = Path("/var/lib/gpushare/sim.state.events")  # the mock plugin's simulated NVML (docs/operations.md)

WHOLE_GPU_USER = """
apiVersion: v1
kind: Pod
metadata: {name: whole-gpu-user, namespace: default}
spec:
  resourceClaims: [{name: gpu, resourceClaimName: whole-gpu}]
  containers:
  - name: app
    image: gpushare-dra:dev
    command: ["sh", "-c", 'trap "exit 0" TERM; "$(gpushare-dra hook-path probe)" meminfo && sleep infinity & wait $!']
    resources: {claims: [{name: gpu}]}
"""


@pytest.fixture
def product(installed: Kube) -> Kube:
    """The kustomize install, its plugin rolled out and publishing (an earlier test here may have
    restarted it)."""
    kube = installed
    kube("rollout", "status", *DS, "--timeout=300s", timeout=320)
    kube.wait_until("ResourceSlices of the node", lambda: slices(kube))
    return kube


def slices(kube: Kube) -> list[dict]:
    return [s for s in kube.items("resourceslices")
            if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == kube.node]


def cu_total(kube: Kube, pod: str) -> int:
    """The memory the pod's container sees on its claim's GPU (CUDA's total, the probe's meminfo
    in the running container): its device 0, the only one it has, on a mock node as on a GPU node."""
    out = kube("exec", pod, "--", "sh", "-c", '"$(gpushare-dra hook-path probe)" meminfo')
    return int(out.split("cu_total=")[1].split()[0])


def results(kube: Kube, claim: str) -> list[dict]:
    return kube.get("resourceclaim", claim)["status"]["allocation"]["devices"]["results"]


def claim_of(kube: Kube, pod: str) -> str:
    """The pod's claim: the one it names, or the one its template or extended resource made."""
    body = kube.get("pod", pod)
    if "extendedResourceClaimStatus" in body["status"]:
        return body["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    [claim] = body["spec"]["resourceClaims"]
    return claim.get("resourceClaimName") or body["status"]["resourceClaimStatuses"][0]["resourceClaimName"]


def delete_in_time(kube: Kube, text: str) -> float:
    """kubectl delete of the objects in text with their pods' own grace period: the seconds it took."""
    start = time.monotonic()
    kube.run("delete", "-f", "-", "--ignore-not-found", "--wait=true", input=text, timeout=180)
    return time.monotonic() - start


def patch_args(kube: Kube, *args: str) -> None:
    kube("patch", *DS, "--type=json", "-p", json.dumps(
        [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": a} for a in args]))
    kube("rollout", "status", *DS, "--timeout=300s", timeout=320)


def restore_args(kube: Kube) -> None:
    kube("apply", "-k", "deploy/overlays/mock")  # the manifests' args again
    kube("rollout", "status", *DS, "--timeout=300s", timeout=320)


def test_capacity_and_first_available_examples(product):
    """capacity/ (the whole GPU first, with a pod of the test's: the example is the claim) and,
    in one go, the rest of capacity/ and first-available/ on the other GPU."""
    kube = product
    whole = examples("capacity/whole-gpu.yaml") + "---\n" + WHOLE_GPU_USER
    rest = examples("capacity/claim-template.yaml") + "---\n" + examples("capacity/shared-claim.yaml") + \
        "---\n" + examples("first-available")
    try:
        kube.apply(whole)
        kube.wait_ready("whole-gpu-user")
        assert cu_total(kube, "whole-gpu-user") == 80 * GiB  # all of the 80Gi GPU's memory
        kube.apply(rest)
        kube.wait_ready("trainer", "team-gpu-a", "team-gpu-b", "flexible")
        assert cu_total(kube, "trainer") == 10 * GiB
        kube.wait_until("trainer's `nvidia-smi -L`", lambda: "GPU 0: " in kube.logs("trainer"), timeout=60)
        team = kube.get("resourceclaim", "team-gpu")["status"]
        assert len(team["allocation"]["devices"]["results"]) == 1, team
        assert sorted(r["name"] for r in team["reservedFor"]) == ["team-gpu-a", "team-gpu-b"]
        assert cu_total(kube, "team-gpu-a") == cu_total(kube, "team-gpu-b") == 8 * GiB
        assert [r["request"] for r in results(kube, claim_of(kube, "flexible"))] == ["gpu/share-20gi"]
        assert cu_total(kube, "flexible") == 20 * GiB
        whole_device = results(kube, "whole-gpu")[0]["device"]
        assert {results(kube, claim_of(kube, "trainer"))[0]["device"], results(kube, "team-gpu")[0]["device"]} \
            == {"gpu-0", "gpu-1"} - {whole_device}
    finally:
        took = delete_in_time(kube, rest + "---\n" + whole)
    assert took < DELETE_BOUND_S, f"deleting the pods took {took:.0f}s: one ignored SIGTERM"


def test_extended_resources_whole_gpu_example(product):
    kube = product
    text = examples("extended-resources/whole-gpu.yaml")  # gpushare.dev/gpu: capacity mode's class
    try:
        kube.apply(text)
        kube.wait_ready("whole-gpu-pod")
        assert [r["driver"] for r in results(kube, claim_of(kube, "whole-gpu-pod"))] == [DRIVER]
        assert cu_total(kube, "whole-gpu-pod") == 80 * GiB  # a whole simulated 80Gi GPU
    finally:
        took = delete_in_time(kube, text)
    assert took < DELETE_BOUND_S, f"deleting the pod took {took:.0f}s: it ignored SIGTERM"


def test_partition_examples(product):
    """The plugin switched to partition mode (--sharing-mode=partition, as an operator's overlay
    would): partition/ (two shares of one GPU) and extended-resources/share.yaml (one share
    without a claim) in one go; 1/8 of an 80Gi GPU per share."""
    kube = product
    text = examples("partition") + "---\n" + examples("extended-resources/share.yaml")
    try:
        patch_args(kube, "--sharing-mode=partition")
        kube.wait_until("partition-mode devices in the slices", lambda: [
            d for s in slices(kube) for d in s["spec"]["devices"]
            if d.get("attributes", {}).get("sharing", {}).get("string") == "partition"], timeout=120)
        kube.apply(text)
        kube.wait_ready("two-shares-pod", "share-pod")
        two = [r["device"] for r in results(kube, "two-shares")]
        assert len(two) == 2 and len({d.split("-share-")[0] for d in two}) == 1, two  # shares of one GPU
        assert cu_total(kube, "two-shares-pod") == 20 * GiB
        assert [r["driver"] for r in results(kube, claim_of(kube, "share-pod"))] == [DRIVER]
        assert cu_total(kube, "share-pod") == 10 * GiB
    finally:
        took = delete_in_time(kube, text)
        restore_args(kube)
    assert took < DELETE_BOUND_S, f"deleting the pods took {took:.0f}s: one ignored SIGTERM"


def test_mps_and_latency_examples(product):
    """Both GPUs serve MPS claims (--mps-gpus=all; the MPS control daemon is the playground's
    stand-in in the plugin's container: no NVIDIA driver here): mps/ and latency/ in one go, each
    claim on an MPS device, each pod with its own memory."""
    kube = product
    text = examples("mps") + "---\n" + examples("latency")
    try:
        patch_args(kube, "--mps-gpus=all", "--mps-control=/opt/venv/bin/python3 -m playground.mpscontrol")
        kube.wait_until("every GPU published as MPS", lambda: {
            d.get("attributes", {}).get("sharingStrategy", {}).get("string")
            for s in slices(kube) for d in s["spec"]["devices"]} == {"MPS"}, timeout=120)
        kube.apply(text)
        pods = {"mps-job-a": 10 * GiB, "mps-job-b": 10 * GiB, "inference-server": 16 * GiB, "training-job": 40 * GiB}
        kube.wait_ready(*pods)
        assert {p: cu_total(kube, p) for p in pods} == pods
        latency = kube.get("resourceclaim", "inference")["spec"]["devices"]["config"][0]["opaque"]["parameters"]
        assert latency["priority"] == "Latency"
    finally:
        took = delete_in_time(kube, text)
        restore_args(kube)
    assert took < DELETE_BOUND_S, f"deleting the pods took {took:.0f}s: one ignored SIGTERM"


def test_health_taints_example(product):
    """An XID 79 on GPU 1 (written into the simulated NVML's event file) taints its device: a
    whole-GPU claim without the toleration gets GPU 0, health-taints/'s (a whole GPU too, which
    tolerates the taint) gets GPU 1, the only one left. The plugin is restarted at the end (a new
    plugin reads only events written after it started: the mark is gone)."""
    kube = product
    plain = examples("capacity/whole-gpu.yaml") + "---\n" + WHOLE_GPU_USER
    text = examples("health-taints")
    try:
        with SIM_EVENTS.open("a") as events:
            events.write("1 xid 79\n")
        taints = kube.wait_until("GPU 1's taint in the slice", lambda: {
            d["name"]: [t["key"] for t in d.get("taints", [])] for s in slices(kube) for d in s["spec"]["devices"]
            if d.get("taints")}, timeout=60)
        assert taints == {"gpu-1": ["gpushare.dev/unhealthy"]}, taints
        kube.apply(plain)
        kube.wait_ready("whole-gpu-user")
        assert results(kube, "whole-gpu")[0]["device"] == "gpu-0"
        kube.apply(text)
        kube.wait_ready("gpu-diagnostics")
        assert results(kube, claim_of(kube, "gpu-diagnostics"))[0]["device"] == "gpu-1"
    finally:
        took = delete_in_time(kube, text + "---\n" + plain)
        kube("rollout", "restart", *DS)
        kube("rollout", "status", *DS, "--timeout=300s", timeout=320)
        kube.wait_until("no taint in the slices", lambda: not [
            d for s in slices(kube) for d in s["spec"]["devices"] if d.get("taints")], timeout=60)
    assert took < DELETE_BOUND_S, f"deleting the pods took {took:.0f}s: one ignored SIGTERM"
