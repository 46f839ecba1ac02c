"""The Helm chart (deploy/helm/gpushare-dra) on the real one-node cluster, as an operator runs it:
`helm install`, claims through the chart's DeviceClasses and admission policies, `helm upgrade`
to another image while pods with claims start (the DaemonSet surges a second plugin pod), and
`helm uninstall`. Runs after test_cluster.py, whose last test removed the kustomize install; run
alone, it removes that install first (the two install the same objects).

helm is built from the Go module proxy by hack/helm (`make test` builds it first).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
import yaml

from tests.support import GiB
from tests.support.cluster import (
    CHART,
    CTR,
    NAMESPACE,
    RELEASE,
    SOCK,
    Helm,
    Kube,
    claim_manifest,
    plugin_pods,
    pods_start_while,
    without_kustomize_install,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(5400)]

MOCK = ["--set", "mock.enabled=true", "--set", "image.tag=dev", "--set", "image.pullPolicy=Never"]


@pytest.fixture(scope="module")
def released(cluster: Kube, helm: Helm) -> Iterator[Kube]:
    """The chart installed with simulated GPUs; uninstalled at the end (if a test did not)."""
    kube = cluster
    without_kustomize_install(kube)
    installed = helm.run("install", RELEASE, CHART, "-n", NAMESPACE, "--create-namespace", *MOCK, "--wait",
                         "--timeout", "5m")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "symbolic link" not in installed.stderr, installed.stderr  # the chart's files are copies
    try:
        yield kube
    finally:
        if RELEASE in helm("list", "-n", NAMESPACE, "-q", "--all").split():  # a refused uninstall too
            kube("-n", NAMESPACE, "annotate", "daemonset/gpushare-kubelet-plugin", "--overwrite",
                 "gpushare.dev/uninstall=force", check=False)
            helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "5m")


def test_helm_install_runs_the_plugin_and_publishes_shares(released):
    kube = released
    [pod] = [p for p in plugin_pods(kube) if p["status"].get("phase") == "Running"]
    assert pod["spec"]["containers"][0]["image"] == "gpushare-dra:dev"
    slices = kube.wait_until("the plugin's ResourceSlices", lambda: [
        s for s in kube.items("resourceslices")
        if s["spec"]["driver"] == "gpushare.dev" and s["spec"].get("nodeName") == kube.node])
    memory = [d["capacity"]["memory"] for s in slices for d in s["spec"]["devices"]
              if "memory" in d.get("capacity", {})]
    assert memory and all(m["value"] == "80Gi" for m in memory), memory
    # A claim that asks no memory gets 1/8 of the GPU's: the devices' requestPolicy default.
    assert all(m["requestPolicy"]["default"] == "10Gi" for m in memory), memory
    annotations = kube.wait_until("the largest GPU's memory on the DeviceClass", lambda: (
        kube.get("deviceclass", "gpushare.dev")["metadata"].get("annotations", {})
        .get("gpushare.dev/largest-gpu-memory")))
    assert annotations == "80Gi"


def test_a_claim_larger_than_any_gpu_is_refused_naming_the_largest(released):
    kube = released
    out = kube.run("apply", "-f", "-", input=claim_manifest("too-big", memory="200Gi"), check=False)
    assert out.returncode != 0, out.stdout
    assert "80Gi" in out.stderr and "gpushare.dev-requests" in out.stderr, out.stderr


def test_a_compute_only_claim_gets_the_default_memory_from_the_real_scheduler(released):
    kube = released
    pod = """
apiVersion: v1
kind: Pod
metadata: {name: compute-only, namespace: default}
spec:
  restartPolicy: Never
  resourceClaims: [{name: gpu, resourceClaimName: compute-only}]
  containers:
  - name: app
    image: gpushare-dra:dev
    command: ["sh", "-c", '"$(gpushare-dra hook-path probe)" meminfo && sleep 300']
    resources: {claims: [{name: gpu}]}
"""
    try:
        told = kube.apply(claim_manifest("compute-only", compute="10"))
        assert "asks for compute and no memory: it gets the default, 1/8 of the GPU's memory" in told, told
        kube.apply(pod)
        # while the pod runs: a claim no pod reserves any more is deallocated
        log = kube.wait_until("the probe's meminfo", lambda: (out if "cu_total=" in (out := kube.logs("compute-only"))
                                                              else None), timeout=180)
        assert f"cu_total={10 * GiB}" in log, log
        [result] = kube.get("resourceclaim", "compute-only")["status"]["allocation"]["devices"]["results"]
        assert result["consumedCapacity"] == {"compute": "10", "memory": "10Gi"}, result
    finally:
        kube("delete", "pod", "compute-only", "--ignore-not-found", "--wait=true", "--grace-period=0", "--force",
             timeout=180)
        kube("delete", "resourceclaim", "compute-only", "--ignore-not-found")


def test_helm_upgrade_to_another_image_surges_and_fails_no_pod(released, helm):
    """Another image tag (the same image, tagged anew in the node's containerd): the DaemonSet
    starts the new plugin pod beside the old (maxSurge 1) while pods with claims start. (The
    kustomize install renders the same DaemonSet, tests/operators/test_helm.py: a `kubectl
    rollout restart` of it replaces the plugin the same way.)"""
    kube = released
    tagged = subprocess.run([str(CTR), "--address", SOCK, "-n", "k8s.io", "images", "tag", "--force",
                             "docker.io/library/gpushare-dra:dev", "docker.io/library/gpushare-dra:dev2"],
                            capture_output=True, text=True, timeout=60)
    assert tagged.returncode == 0, tagged.stderr
    seen: set[str] = set()

    def upgrade():
        before = {p["metadata"]["uid"] for p in plugin_pods(kube)}
        helm("upgrade", RELEASE, CHART, "-n", NAMESPACE, "--reuse-values", "--set", "image.tag=dev2")
        # maxSurge 1, maxUnavailable 0: the old pod still runs when the new one is there
        both = kube.wait_until("a second plugin pod beside the first", lambda: (
            pods if len(pods := plugin_pods(kube)) == 2 else None), timeout=120, every=0.5)
        seen.update(p["metadata"]["uid"] for p in both)
        assert before & seen, (before, seen)

    pods_start_while(kube, upgrade)
    images = {p["spec"]["containers"][0]["image"] for p in plugin_pods(kube)}
    assert images == {"gpushare-dra:dev2"}, images
    failed = [e for e in kube.items("events") if e["involvedObject"].get("name", "").startswith("rolling-")
              and "NodePrepareResources" in e.get("message", "") and e.get("type") == "Warning"]
    assert not failed, failed


IN_USE_POD = """
apiVersion: v1
kind: Pod
metadata: {name: uninstall-user, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: gpu, resourceClaimName: uninstall-held}]
  containers:
  - name: app
    image: gpushare-dra:dev
    command: ["sleep", "600"]
    resources: {claims: [{name: gpu}]}
"""


def test_helm_uninstall_refuses_while_a_claim_is_in_use_then_force_unprepares_and_removes_everything(
        released, helm):
    """The pre-delete hook: refused, naming the claim, with the plugin left running (the release
    "uninstalling"); with the DaemonSet annotated gpushare.dev/uninstall=force the hook deletes the
    claim's pod, the plugin unprepares it, and the uninstall removes every object the chart made."""
    kube = released
    made = [d for d in yaml.safe_load_all(helm("get", "manifest", RELEASE, "-n", NAMESPACE)) if d]
    assert {d["kind"] for d in made} >= {"DaemonSet", "DeviceClass", "ServiceAccount", "ClusterRole"}
    try:
        kube.apply(claim_manifest("uninstall-held", memory="1Gi", compute="10"))
        kube.apply(IN_USE_POD)
        kube.wait_ready("uninstall-user", timeout=180)
        refused = helm.run("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "3m")
        assert refused.returncode != 0, refused.stdout
        told = refused.stdout + refused.stderr
        assert "1 claim(s) of gpushare.dev in use: default/uninstall-held" in told and "uninstall-user" in told, told
        assert RELEASE in helm("list", "-n", NAMESPACE, "-q", "--uninstalling").split()
        assert [p["status"]["phase"] for p in plugin_pods(kube)] == ["Running"]
        assert kube.get("pod", "uninstall-user")["status"]["phase"] == "Running"

        kube("-n", NAMESPACE, "annotate", "daemonset/gpushare-kubelet-plugin", "gpushare.dev/uninstall=force")
        helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "5m")
        assert kube.run("get", "pod", "uninstall-user", check=False).returncode != 0  # deleted, not hanging
        claim = kube.get("resourceclaim", "uninstall-held")
        assert not claim["status"].get("reservedFor") and not [
            d for d in claim["status"].get("devices") or [] if d["driver"] == "gpushare.dev"], claim["status"]
    finally:
        kube("delete", "pod", "uninstall-user", "--ignore-not-found", "--wait=true", "--grace-period=0", "--force",
             timeout=180)
        kube("delete", "resourceclaim", "uninstall-held", "--ignore-not-found")
    left = []
    for d in made:
        ns = d["metadata"].get("namespace") or (NAMESPACE if d["kind"] not in CLUSTER_SCOPED else None)
        args = ["get", d["kind"], d["metadata"]["name"], "--ignore-not-found", "-o", "name"]
        if ns:
            args += ["-n", ns]
        if kube(*args).strip():
            left.append(f"{d['kind']}/{d['metadata']['name']}")
    assert not left, left
    hook = "gpushare-dra-uninstall-check"  # the hook's own objects go too
    assert not kube("get", f"job/{hook}", f"serviceaccount/{hook}", f"clusterrole/{hook}", f"clusterrolebinding/{hook}",
                    "-n", NAMESPACE, "-o", "name", "--ignore-not-found").strip()
    kube.wait_until("the plugin pods to be gone", lambda: not plugin_pods(kube), timeout=180)


CLUSTER_SCOPED = {"DeviceClass", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding", "Namespace", "PriorityClass"}
