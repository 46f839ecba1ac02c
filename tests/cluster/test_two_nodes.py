"""Two real nodes on one machine (hack/cluster-up --nodes 2): the second node's own kubelet and
containerd, in a mount namespace where the plugin DaemonSet's host paths are that node's folders,
joined to the running cluster of this folder. The real scheduler, controllers and kubelets decide
what happens; the tests measure it (docs/operations.md, "Two nodes" and "A node lost").

The module adds the second node to the running cluster (about 40 s warm, rather than a second
cold cluster) and removes it again with hack/cluster-down --node 2, judged by the host's traces
before and after and by other software planted meanwhile (tests/support/neighbours.py).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support import neighbours
from tests.support.cluster import (
    DOWN,
    NAMESPACE,
    STATE,
    UP,
    Kube,
    claim_manifest,
    claim_template,
    host_traces,
    plugin_pods,
)
from tests.support.neighbours import Neighbours

pytestmark = [pytest.mark.cluster, pytest.mark.two_nodes, pytest.mark.timeout(1200)]

NODE2_ROOT = STATE / "node2" / "root"  # hack/cluster/lib.sh node2_state/root: the node's own host paths
GiB = 1024**3
LABEL = "test=two-nodes"


def run(*cmd: str, timeout: float = 600) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout}\n{out.stderr[-3000:]}"
    return out.stdout


def pod(name: str, claim: dict, *, node: str | None = None, tolerate_lost_s: int | None = None,
        spread: bool = False) -> str:
    """A pod of the product's image holding one claim (claim: resourceClaimName or
    resourceClaimTemplateName) that prints what the claim gives (the probe's meminfo) and sleeps,
    on `node` when given; `tolerate_lost_s` bounds how long it stays
    bound to an unreachable node (the default, from DefaultTolerationSeconds, is 300 s)."""
    spec: dict = {
        "terminationGracePeriodSeconds": 1,
        "resourceClaims": [{"name": "gpu", **claim}],
        "containers": [{"name": "app", "image": "gpushare-dra:dev",
                        "command": ["sh", "-c", '"$(gpushare-dra hook-path probe)" meminfo && sleep infinity'],
                        "resources": {"claims": [{"name": "gpu"}]}}],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if tolerate_lost_s is not None:
        spec["tolerations"] = [{"key": f"node.kubernetes.io/{why}", "operator": "Exists", "effect": "NoExecute",
                                "tolerationSeconds": tolerate_lost_s} for why in ("unreachable", "not-ready")]
    if spread:
        spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                              "whenUnsatisfiable": "DoNotSchedule",
                                              "labelSelector": {"matchLabels": {"spread": "two-nodes"}}}]
    labels = {"test": "two-nodes", **({"spread": "two-nodes"} if spread else {})}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": "default", "labels": labels}, "spec": spec})


def claim_of(kube: Kube, pod_name: str) -> dict:
    status = kube.get("pod", pod_name)["status"]
    name = status["resourceClaimStatuses"][0]["resourceClaimName"]
    return kube.get("resourceclaim", name)


def pool_of(claim: dict) -> str | None:
    results = (claim["status"].get("allocation") or {}).get("devices", {}).get("results", [])
    return results[0]["pool"] if results else None


def phase(kube: Kube, name: str) -> str:
    return kube.get("pod", name)["status"].get("phase", "")


def ready(kube: Kube, node: str) -> str:
    conditions = kube.get("node", node)["status"].get("conditions", [])
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "")


def gpushare_slices(kube: Kube, node: str) -> list[dict]:
    return [s for s in kube.items("resourceslices")
            if s["spec"]["driver"] == "gpushare.dev" and s["spec"].get("nodeName") == node]


def cleanup(kube: Kube) -> None:
    kube("delete", "pods", "-l", LABEL, "--ignore-not-found", "--wait=true", "--grace-period=1", timeout=180)
    kube("delete", "resourceclaims,resourceclaimtemplates", "-l", LABEL, "--ignore-not-found", timeout=120)


@pytest.fixture(scope="module")
def two(installed: Kube) -> Iterator[tuple[Kube, str]]:
    """The running cluster with its second node (hack/cluster-up --nodes 2), the plugin Running
    there and publishing; hack/cluster-down --node 2 at the end. Yields (kube, second node)."""
    kube = installed
    kube.two_before = host_traces()  # type: ignore[attr-defined]
    kube.two_neighbours = (None if neighbours.why_not()  # type: ignore[attr-defined]
                           else Neighbours(f"nodes2{time.monotonic_ns()}").plant(podman=False))
    try:
        start = time.monotonic()
        run(str(UP), "--nodes", "2")
        second = f"{kube.node}-2"
        kube("-n", NAMESPACE, "rollout", "status", "daemonset/gpushare-kubelet-plugin", "--timeout=300s", timeout=320)
        kube.wait_until(f"ResourceSlices of gpushare.dev for {second}", lambda: gpushare_slices(kube, second))
        print(f"second node joined and publishing in {time.monotonic() - start:.0f}s")
        yield kube, second
    finally:
        cleanup(kube)
        subprocess.run([str(DOWN), "--node", "2"], capture_output=True, text=True, timeout=300)
        if kube.two_neighbours is not None:  # type: ignore[attr-defined]
            kube.two_neighbours.remove()  # type: ignore[attr-defined]


def test_the_plugin_runs_on_both_nodes_each_with_its_own_folders(two):
    kube, second = two
    running = {p["spec"].get("nodeName") for p in plugin_pods(kube) if p["status"].get("phase") == "Running"}
    assert {kube.node, second} <= running, running
    for node in (kube.node, second):
        (pool,) = {s["spec"]["pool"]["name"] for s in gpushare_slices(kube, node)}
        assert pool == node
    # Each plugin registered with its own node's kubelet, in that node's folder: one socket each
    # (<driver>-<pod uid>-reg.sock), the pod's own.
    for node, registry in ((kube.node, Path("/var/lib/kubelet/plugins_registry")),
                           (second, NODE2_ROOT / "var/lib/kubelet/plugins_registry")):
        (uid,) = [p["metadata"]["uid"] for p in plugin_pods(kube) if p["spec"].get("nodeName") == node]
        assert [s.name for s in registry.glob("gpushare.dev-*-reg.sock")] == [f"gpushare.dev-{uid}-reg.sock"]


def test_a_claim_templates_pods_spread_and_each_node_prepares_its_own(two):
    kube, second = two
    try:
        kube.apply(claim_template("spread", memory="1Gi"))
        for i in range(2):
            kube.apply(pod(f"spread-{i}", {"resourceClaimTemplateName": "spread"}, spread=True))
        kube.wait_until("both spread pods to run", lambda: all(
            phase(kube, f"spread-{i}") == "Running" for i in range(2)), timeout=240)
        nodes = {kube.get("pod", f"spread-{i}")["spec"]["nodeName"]: i for i in range(2)}
        assert set(nodes) == {kube.node, second}, nodes
        for node, i in nodes.items():
            assert pool_of(claim_of(kube, f"spread-{i}")) == node
            kube.wait_until(f"spread-{i}'s probe line", lambda i=i: f"cu_total={GiB}" in kube.logs(f"spread-{i}"))
    finally:
        cleanup(kube)
        kube("delete", "resourceclaimtemplate", "spread", "--ignore-not-found")


def test_the_scheduler_places_a_claim_on_the_node_with_room(two):
    """The first node's two 80Gi GPUs held whole; a 40Gi claim with no node asked lands on the second."""
    kube, second = two
    try:
        kube.apply(claim_template("full", memory="80Gi"))
        for i in range(2):
            kube.apply(pod(f"full-{i}", {"resourceClaimTemplateName": "full"}, node=kube.node))
        kube.wait_until("the first node's GPUs to be held", lambda: all(
            phase(kube, f"full-{i}") == "Running" for i in range(2)), timeout=240)
        kube.apply(claim_template("roomy", memory="40Gi"))
        kube.apply(pod("roomy", {"resourceClaimTemplateName": "roomy"}))
        kube.wait_until("the 40Gi pod to run", lambda: phase(kube, "roomy") == "Running", timeout=240)
        assert kube.get("pod", "roomy")["spec"]["nodeName"] == second
        assert pool_of(claim_of(kube, "roomy")) == second
        kube.wait_until("its probe's line", lambda: f"cu_total={40 * GiB}" in kube.logs("roomy"), timeout=60)
    finally:
        cleanup(kube)
        kube("delete", "resourceclaimtemplate", "full", "roomy", "--ignore-not-found")


def test_a_node_lost_and_back(two):
    """The second node loses power (hack/cluster-down --node 2 --keep-state: its kubelet,
    containerd and containers killed, its folders kept), then comes back (hack/cluster-up --nodes 2).
    What the real controllers do meanwhile, with the times, is printed and asserted."""
    kube, second = two
    times: dict[str, float] = {}
    try:
        shared_claim = yaml.safe_load(claim_manifest("lost-shared", memory="10Gi"))
        shared_claim["metadata"]["labels"] = {"test": "two-nodes"}
        kube.apply(yaml.safe_dump(shared_claim))
        kube.apply(claim_template("kept", memory="2Gi"))
        kube.apply(pod("lost-a", {"resourceClaimName": "lost-shared"}, node=second, tolerate_lost_s=10))
        kube.apply(pod("kept", {"resourceClaimTemplateName": "kept"}, node=second))
        kube.wait_until("both pods on the second node to run",
                        lambda: phase(kube, "lost-a") == "Running" and phase(kube, "kept") == "Running", timeout=240)
        kept_claim = claim_of(kube, "kept")
        kept_uid = kept_claim["metadata"]["uid"]
        shared_uid = kube.get("resourceclaim", "lost-shared")["metadata"]["uid"]
        specs = NODE2_ROOT / "var/run/cdi"
        assert [f for f in specs.iterdir() if kept_uid in f.name], list(specs.iterdir())

        t0 = time.monotonic()
        run(str(DOWN), "--node", "2", "--keep-state")
        times["power cut"] = time.monotonic() - t0

        kube.wait_until("the node to be not Ready", lambda: ready(kube, second) != "True", timeout=180, every=1)
        times["node not Ready"] = time.monotonic() - t0
        taints = kube.wait_until("the unreachable NoExecute taint", lambda: {
            t["key"] for t in kube.get("node", second)["spec"].get("taints", []) if t["effect"] == "NoExecute"},
            timeout=60, every=1)
        assert "node.kubernetes.io/unreachable" in taints, taints
        times["tainted unreachable"] = time.monotonic() - t0
        kube.wait_until("lost-a to be deleted (its 10 s toleration)",
                        lambda: kube.get("pod", "lost-a")["metadata"].get("deletionTimestamp"), timeout=90, every=1)
        times["lost-a deleted (Terminating)"] = time.monotonic() - t0
        # No kubelet confirms it: the pod stays, Terminating, and keeps its claim; the node's slices stay.
        kube.apply(pod("lost-b", {"resourceClaimName": "lost-shared"}))
        time.sleep(20)
        assert kube.get("pod", "lost-a")["metadata"]["deletionTimestamp"]
        shared = kube.get("resourceclaim", "lost-shared")
        assert [r["name"] for r in shared["status"].get("reservedFor", [])] == ["lost-a"], shared["status"]
        assert pool_of(shared) == second
        assert phase(kube, "lost-b") == "Pending" and not kube.get("pod", "lost-b")["spec"].get("nodeName")
        assert gpushare_slices(kube, second), "the lost node's slices"
        assert kube.get("pod", "kept")["metadata"].get("deletionTimestamp") is None  # 300 s default toleration
        assert phase(kube, "kept") == "Running"  # as last reported: no kubelet reports otherwise

        t1 = time.monotonic()
        run(str(UP), "--nodes", "2")
        times["node back (cluster-up)"] = time.monotonic() - t1
        kube.wait_until("lost-a to be gone", lambda: not kube.items("pods", "--field-selector=metadata.name=lost-a"),
                        timeout=240, every=1)
        times["lost-a gone after return"] = time.monotonic() - t1
        kube.wait_until("lost-b to run", lambda: phase(kube, "lost-b") == "Running", timeout=240, every=1)
        times["lost-b Running after return"] = time.monotonic() - t1
        kube.wait_until("kept to run again", lambda: phase(kube, "kept") == "Running" and all(
            cs.get("ready") for cs in kube.get("pod", "kept")["status"].get("containerStatuses", [])), timeout=240)
        times["kept Running again"] = time.monotonic() - t1
        status = kube.get("pod", "kept")["status"]["containerStatuses"][0]
        assert status["restartCount"] >= 1, status  # the power cut killed its container: the kubelet restarted it
        assert claim_of(kube, "kept")["metadata"]["uid"] == kept_uid and pool_of(claim_of(kube, "kept")) == second
        assert [f for f in specs.iterdir() if kept_uid in f.name]
        # The kubelet finished lost-a's deletion: it unprepared the shared claim through the
        # plugin, which knew it from its checkpoint alone (its pod and CDI spec were gone with the power).
        lost_b_on = kube.get("pod", "lost-b")["spec"]["nodeName"]
        assert pool_of(kube.get("resourceclaim", "lost-shared")) == lost_b_on
        shared_specs = [f.name for f in specs.iterdir() if shared_uid in f.name]
        assert bool(shared_specs) == (lost_b_on == second), (lost_b_on, shared_specs)
        plugin = next(p for p in plugin_pods(kube) if p["spec"].get("nodeName") == second and
                      p["status"].get("phase") == "Running")
        recovered = [ln for ln in kube.logs(plugin["metadata"]["name"], "plugin", namespace=NAMESPACE).splitlines()
                     if "state recovered" in ln]
        print(f"\nlost-b on {lost_b_on}; plugin: {recovered}")
        assert recovered, "the second node's plugin recovered its checkpoint"
        # The restarted container still gets its claim's 2Gi, not the whole GPU. Last, as it
        # failed in the first runs (the whole 80Gi seen after the return; not yet explained).
        log = kube.wait_until("kept's probe line after the restart", lambda: (
            lambda log: log if "cu_total=" in log else None)(kube.logs("kept")), timeout=60)
        assert f"cu_total={2 * GiB}" in log, log
    finally:
        print(f"\nnode lost and back: { {k: round(v) for k, v in times.items()} }", flush=True)
        if ready(kube, second) != "True":
            subprocess.run([str(UP), "--nodes", "2"], capture_output=True, text=True, timeout=600)
        cleanup(kube)
        kube("delete", "resourceclaimtemplate", "kept", "--ignore-not-found")


def test_cluster_down_node_2_leaves_nothing_of_it(two):
    kube, second = two
    down = subprocess.run([str(DOWN), "--node", "2"], capture_output=True, text=True, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not (STATE / "node2").exists()
    kube.wait_until("the second node's Node object to be gone",
                    lambda: not kube.items("nodes", f"--field-selector=metadata.name={second}"))
    kube.wait_until("its slices to be gone (their owner deleted)", lambda: not gpushare_slices(kube, second))
    if kube.two_neighbours is not None:
        assert kube.two_neighbours.missing() == [], "cluster-down --node 2 removed or ended other software's"
    after = host_traces()
    before = kube.two_before
    changed = {kind: {"left": sorted(set(after[kind]) - set(before[kind])),
                      "gone": sorted(set(before[kind]) - set(after[kind]))}
               for kind in after if set(after[kind]) != set(before[kind])}
    # The first node's pods come and go meanwhile (its cgroups, netns, CNI results): only traces
    # of the second node count here.
    second_node = ("node2", "gpushare1", "10.89.")
    changed = {kind: {k: [x for x in v if any(s in x for s in second_node)] for k, v in d.items()}
               for kind, d in changed.items()}
    assert all(not v for d in changed.values() for v in d.values()), changed
