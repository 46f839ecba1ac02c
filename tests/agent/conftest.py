"""Fixtures: a kubelet plugin on mock GPUs with the simulated driver (so probes run and the
agent samples the simulated NVML), its metrics on a free port, and probes "in containers"
through ProcessRunner (the claim's CDI spec applied to a host process)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from kubeletplugin.claimfiles import unmount_all_regions
from kubeletplugin.claimref import ClaimRef
from playground.claims import make_claim, result
from playground.containers import PodmanRunner, ProcessRunner
from playground.kubelet import Kubelet
from tests.support import BUILD, wait_for
from tests.support.mig import MIG_GPU, set_mig_mode
from tests.support.plugin import Dirs, launch_plugin


@pytest.fixture(scope="session")
def sim_hook_dir():
    """libgpushare.so with the simulated driver beside it (sim/), as install-hook --with-sim lays out."""
    if not (BUILD / "sim" / "libnvidia-ml.so.1").is_file():
        pytest.skip("hook/build not built (make -C hook)")
    folder = tempfile.mkdtemp(prefix="gsag")
    shutil.copy(BUILD / "libgpushare.so", folder)
    shutil.copytree(BUILD / "sim", os.path.join(folder, "sim"), symlinks=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def relay_threads(tmp_path_factory) -> str:
    """relay_threads.c built: a tenant whose threads keep replacing each other (issue 40)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    binary = str(tmp_path_factory.mktemp("relay") / "relay_threads")
    subprocess.run([compiler, "-O2", "-Wall", "-pthread", "-o", binary,
                    os.path.join(os.path.dirname(__file__), "relay_threads.c"), "-ldl"], check=True)
    return binary


class Node:
    """A running plugin with its agent, a kubelet stand-in and a container runner."""

    def __init__(self, api, dirs: Dirs, hook_dir: str, changes: dict, cdi_root: str | None = None, backend=None):
        self.api = api
        self.dirs = dirs
        changes = {"metrics_addr": "127.0.0.1:0", "agent_interval": 0.5, **changes}
        self._launch = lambda: launch_plugin(api, dirs, hook_dir, cdi_root, backend, **changes)
        self.plugin = self._launch()
        self.kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
        self.runner = ProcessRunner(dirs.cdi, str(BUILD / "gpushare-probe"), dirs.root)
        self.workloads = []
        self.mig_claims: list[ClaimRef] = []  # prepared by share_instance: unprepared by the mig_node fixture
        self.url = f"http://127.0.0.1:{self.plugin.metrics_port}/metrics"

    def restart_plugin(self, while_stopped: Callable[[], object] | None = None) -> None:
        """Stop the plugin and start it again on the same folders (a pod restart); the kubelet
        stand-in reconnects to the same socket. `while_stopped` runs in between."""
        self.plugin.stop(grace=1)
        if while_stopped is not None:
            while_stopped()
        self.plugin = self._launch()
        self.url = f"http://127.0.0.1:{self.plugin.metrics_port}/metrics"

    def claim(self, memory: str = "1Gi", compute: int = 50, gpu: int = 0, config: list | None = None):
        """Create, allocate and prepare a claim; returns (its ClaimRef, cdi device ids)."""
        ref = make_claim(self.api, [result(f"gpu-{gpu}", consumed={"memory": memory, "compute": str(compute)})],
                         config=config)
        answer = self.kubelet.prepare(ref).claims[ref.uid]
        assert not answer.error, answer.error
        return ref, [i for d in answer.devices for i in d.cdi_device_ids]

    def run(self, name: str, ids: list[str], *argv: str):
        w = self.runner.start(name, ids, list(argv))
        self.workloads.append(w)
        return w

    def scrape(self) -> dict[str, dict[tuple, float]]:
        text = urllib.request.urlopen(self.url, timeout=10).read().decode()
        out: dict[str, dict[tuple, float]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
        return out

    def claim_metric(self, name: str, ref: ClaimRef) -> float | None:
        for labels, value in self.scrape().get(name, {}).items():
            if dict(labels).get("claim") == ref.name:
                return value
        return None

    def share(self, ref: ClaimRef, gpu: int = 0):
        """The agent's controller state of the claim (after its first period with the claim)."""
        return wait_for(lambda: self.plugin.agent.claims.get(ref.uid)).shares[gpu]

    def read_claim(self, ref: ClaimRef) -> dict:
        return client.ResourceV1Api(self.api).read_namespaced_resource_claim(
            ref.name, ref.namespace, _preload_content=False).json()

    def close(self) -> None:
        for w in self.workloads:
            w.stop()
        self.kubelet.close()
        self.plugin.stop(grace=1)


@pytest.fixture(scope="session")
def node_root():
    root = tempfile.mkdtemp(prefix="gsag")
    yield root
    unmount_all_regions(Dirs(root).state)  # claims a test left prepared
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def node_factory(api, sim_hook_dir, node_root):
    """One node at a time, all on one state dir: the agent loads the simulated NVML once per
    process and it keeps the state file it opened first, so every node keeps that sim.state.
    Everything else is removed between nodes."""
    nodes: list[Node] = []

    def make(cdi_root: str | None = None, backend=None, **changes) -> Node:
        """`changes`: PluginConfig's fields; `backend`: instead of the one they name."""
        assert not nodes, "one node per test"
        for entry in os.listdir(node_root):
            if entry != "state":
                shutil.rmtree(os.path.join(node_root, entry))
        state = os.path.join(node_root, "state")
        unmount_all_regions(state)
        for entry in os.listdir(state) if os.path.isdir(state) else []:
            if entry != "sim.state":
                path = os.path.join(state, entry)
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
        n = Node(api, Dirs(node_root), sim_hook_dir, changes, cdi_root, backend)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        n.close()


@pytest.fixture
def node(node_factory):
    return node_factory()


@pytest.fixture
def image_claim(node_factory):
    """For the images users run (test_image_matrix.py, test_image_pacing.py): a node whose CDI
    specs podman reads, and one claim of 256Mi at compute 50, unprepared at the end; (node, the
    claim's CDI device ids)."""
    node = node_factory(cdi_root=PodmanRunner.CDI_ROOT)
    ref, ids = node.claim(memory="256Mi", compute=50)
    yield node, ids
    node.kubelet.unprepare(ref)


# ---- MIG (docs/mig.md): claims sharing one instance in capacity mode (tests/support/mig.py) -----------
@pytest.fixture
def mig_node(node_factory):
    """A node whose GPU 3 is in MIG mode and offered as MIG devices. At the end its workloads are
    stopped and its claims on the instance unprepared (the instance destroyed), then the mode is
    set back: the worker's later nodes share the simulated state."""
    node = node_factory(mig_gpus=str(MIG_GPU))  # (its agent loads the simulated NVML: pynvml answers from it)
    was = set_mig_mode(True)
    node.restart_plugin()  # discovers the mode
    yield node
    for w in node.workloads:
        w.stop()
    for ref in node.mig_claims:
        node.kubelet.unprepare(ref)
    if not was:
        set_mig_mode(False)
