"""Fixtures of the real-cluster suite: ONE one-node cluster (hack/cluster-up: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, containerd, a kubelet), shared by every test here, with
the product installed as users install it (`kubectl apply -k deploy/overlays/mock`).

A cluster that already runs is reused and left running; one these tests started is stopped
with hack/cluster-down by the last test of this folder (test_cluster_down.py), else after it
(package scope); GPUSHARE_CLUSTER_KEEP=1 keeps it running, for a faster next run. `make test` runs
this folder beside its parallel part (the cluster mostly waits), never beside the serial one.
Every test skips, with the reason, where the cluster cannot be had: not root, a tool missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support import neighbours
from tests.support.cluster import DOWN, HELM, STATE, UP, Helm, Kube, host_traces, up_failures, why_not
from tests.support.neighbours import Neighbours

COLD_UP_TIMEOUT = 4800  # a cold Go build of the five binaries on 2 cores, the image and the debs
# The files run in this order, each finding the state the one before left (one install of each
# kind): test_examples.py uses the kustomize install `installed` made; test_cluster.py's last test
# deletes it (kubectl delete -k); test_helm_install.py and test_upgrade.py install the chart on a
# cluster without it; test_cluster_down.py takes the cluster down, after every other test here.
# test_two_nodes.py (`make test-two-nodes`) uses that install too, and removes its second node.
ORDER = ("test_examples.py", "test_two_nodes.py", "test_cluster.py", "test_helm_install.py", "test_upgrade.py",
         "test_cluster_down.py")


def _rank(item: pytest.Item) -> int:
    return ORDER.index(item.path.name) if item.path.name in ORDER else len(ORDER)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This folder's tests (one span of items) sorted by ORDER, stable within a file."""
    mine = [i for i, item in enumerate(items) if item.nodeid.startswith("tests/cluster/")]
    for i, item in zip(mine, sorted((items[i] for i in mine), key=_rank), strict=True):
        items[i] = item


def _parse_up_output(stdout: str) -> tuple[str, str]:
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("export KUBECONFIG="), f"cluster-up's last line: {lines[-1:]}"
    kubeconfig = lines[-1].split("=", 1)[1]
    path_line = next(ln for ln in lines if ln.startswith("export PATH="))
    kbin = path_line.split("=", 1)[1].split(":", 1)[0]
    return kubeconfig, os.path.join(kbin, "kubectl")


def _up(out) -> subprocess.CompletedProcess[str]:
    """hack/cluster-up, its progress lines (stderr) shown as they come: a cold build takes many
    minutes and the suite should not sit silent meanwhile."""
    proc = subprocess.Popen([str(UP)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(COLD_UP_TIMEOUT, proc.kill)
    watchdog.start()
    stdout: list[str] = []
    pump = threading.Thread(target=lambda: stdout.extend(proc.stdout or ()), daemon=True)
    pump.start()
    stderr = []
    for line in proc.stderr or ():
        stderr.append(line)
        out(line.rstrip())
    proc.wait()
    watchdog.cancel()
    pump.join()
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(stdout), "".join(stderr))


@pytest.fixture(scope="package")
def cluster(pytestconfig: pytest.Config) -> Iterator[Kube]:
    """The running cluster (started here unless one runs already); stopped at the end if started here.
    Before starting one it notes the host's traces of a cluster (host_traces) and plants other
    software (tests/support/neighbours.py) for test_cluster_down.py to judge cluster-down by."""
    if why := why_not():
        pytest.skip(why)
    if up_failures:
        pytest.fail(f"hack/cluster-up failed for an earlier test:\n{up_failures[0]}", pytrace=False)
    already = (STATE / "pids" / "kubelet.pid").exists()
    before = None if already else host_traces()
    planted = None if already or neighbours.why_not() else Neighbours(f"cluster{os.getpid()}").plant(podman=False)
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")

    def out(line: str) -> None:
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(line)

    start = time.monotonic()
    proc = _up(out)
    try:
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
            up_failures.append(tail)
            pytest.fail(f"hack/cluster-up exited {proc.returncode}:\n{tail}", pytrace=False)
        out(f"cluster-up: {time.monotonic() - start:.0f}s")
        kubeconfig, kubectl = _parse_up_output(proc.stdout)
        node = json.loads(subprocess.run([kubectl, f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "json"],
                                         capture_output=True, text=True, check=True).stdout)["items"][0]
        kube = Kube(kubectl, kubeconfig, node["metadata"]["name"])
        kube.before, kube.neighbours = before, planted
        yield kube
    finally:
        # A cluster-up that failed halfway leaves what it started: cluster-down removes it too.
        if not already and not os.environ.get("GPUSHARE_CLUSTER_KEEP"):
            subprocess.run([str(DOWN)], capture_output=True, text=True, timeout=300)
        if planted is not None:
            planted.remove()


@pytest.fixture(scope="package")
def installed(cluster: Kube) -> Kube:
    """The product as users install it: kubectl apply -k deploy/overlays/mock, the plugin Running.
    What the API server refused is kept (cluster.install) for the first test to report: an object
    refused (an admission policy, say) fails that test, not every test."""
    cluster.install = cluster.run("apply", "-k", "deploy/overlays/mock", check=False)
    cluster("-n", "gpushare-system", "rollout", "status", "daemonset/gpushare-kubelet-plugin",
            "--timeout=300s", timeout=320)
    cluster.wait_until("ResourceSlices of gpushare.dev for the node", lambda: [
        s for s in cluster.items("resourceslices")
        if s["spec"]["driver"] == "gpushare.dev" and s["spec"].get("nodeName") == cluster.node])
    return cluster


@pytest.fixture(scope="package")
def helm(cluster: Kube) -> Helm:
    built = subprocess.run([str(HELM)], capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, f"hack/helm exited {built.returncode}:\n{built.stderr}"
    return Helm(built.stdout.strip().splitlines()[-1], cluster)
