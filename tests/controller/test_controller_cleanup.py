"""`cleanup` and the `controller` subcommand, through the CLI as an operator runs them."""

import json
import os
import signal
import subprocess
import sys

import pytest
from kubernetes import client

from dra_driver.cli import main
from dra_driver.controller import delete_slices
from tests.support import wait_for
from tests.support.slices import slices_of


def _slice(name, driver, node):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                   "resourceSliceCount": 1}, "devices": []}}


def _populate(emu):
    api = client.ResourceV1Api(emu.api_client())
    for driver in ("gpushare.dev", "other.example.com"):
        for node in ("node-a", "node-b"):
            api.create_resource_slice(_slice(f"{node}-{driver}", driver, node))


def _names(emu):
    return sorted(s.metadata.name for s in client.ResourceV1Api(emu.api_client()).list_resource_slice().items)


def test_delete_slices_of_one_node(emulator):
    _populate(emulator)
    assert delete_slices(emulator.api_client(), "gpushare.dev", "node-a") == 1
    assert _names(emulator) == ["node-a-other.example.com", "node-b-gpushare.dev", "node-b-other.example.com"]


def test_cleanup_cli_node_and_all_nodes(emulator, tmp_path):
    _populate(emulator)
    kubeconfig = emulator.write_kubeconfig(str(tmp_path / "kubeconfig"))
    assert main(["cleanup", "--kubeconfig", kubeconfig, "--node-name", "node-b"]) == 0
    assert _names(emulator) == ["node-a-gpushare.dev", "node-a-other.example.com", "node-b-other.example.com"]
    assert main(["cleanup", "--kubeconfig", kubeconfig, "--all-nodes"]) == 0
    assert _names(emulator) == ["node-a-other.example.com", "node-b-other.example.com"]


def test_cleanup_cli_needs_a_node(emulator, tmp_path, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    kubeconfig = emulator.write_kubeconfig(str(tmp_path / "kubeconfig"))
    assert main(["cleanup", "--kubeconfig", kubeconfig]) == 2


# The child is a fresh Python: its start to the first slice took 3.9-17.3 s in three runs at load
# 15-17 on 2 cores, against a 20 s bound. Nothing here is timed: the bounds only keep a hung child
# from hanging the suite.
CHILD_TIMEOUT_S = 120


def test_controller_cli_publishes_until_sigterm_and_leaves_slices(emulator, tmp_path):
    kubeconfig = emulator.write_kubeconfig(str(tmp_path / "kubeconfig"))
    proc = subprocess.Popen([sys.executable, "-m", "dra_driver.cli", "controller", "--kubeconfig", kubeconfig,
                             "--node-name", "node-a", "--device-backend", "mock", "--mock-gpus", "2x40Gi",
                             "--sharing-mode", "partition", "--partitions", "2", "--log-format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        wait_for(lambda: slices_of(emulator), timeout=CHILD_TIMEOUT_S)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    [s] = slices_of(emulator)
    assert len(s["spec"]["devices"]) == 4


def test_cleanup_node_state(node_files):
    state, cdi_root, hook = node_files
    flags = ["cleanup", "--keep-slices", "--node-state", "--state-dir", str(state), "--cdi-root", str(cdi_root)]
    assert main(flags) == 1  # a claim is still prepared: nothing removed
    assert (state / "checkpoint.json").exists() and len(os.listdir(cdi_root)) == 4
    assert main([*flags, "--force", "--hook-dir", str(hook)]) == 0
    assert not state.exists()  # only our files were in it
    # Ours went: the prepared claim's and the one that mounts our claim folders. Another vendor's
    # spec stays, and so does another plugin's of our kind (its own state dir) in the shared root.
    assert sorted(os.listdir(cdi_root)) == [f"k8s.gpushare.dev-claim_{OTHER_RUN}.json", "nvidia.yaml"]
    assert sorted(os.listdir(hook)) == ["README"]  # not ours: kept, and so the folder
    assert main(["cleanup", "--keep-slices"]) == 2  # nothing to do


OTHER_RUN = "6e2b9c0d-1a4f-4b8e-8c3d-5f7a9b1c2d3e"  # a claim another plugin (its own state dir) prepared


@pytest.fixture
def node_files(tmp_path):
    """A node's files as a plugin leaves them: one prepared claim, its CDI spec, installed libraries."""
    from dra_driver.install import install_versioned
    from kubeletplugin.checkpoint import PREPARE_COMPLETED, Checkpoint, Entry
    from kubeletplugin.prepared import PreparedClaim, PreparedDevice, PreparedGpu

    uid = "3f1c2a9e-6f0b-4d5e-9a43-2f5c0b7d9e11"
    state, cdi_root, hook = tmp_path / "state", tmp_path / "cdi", tmp_path / "hook"
    (state / "claims" / uid).mkdir(parents=True)
    (state / "claims" / uid / "limits").write_text("GPUSHARE_LIMITS_VERSION=1\n")
    (state / "sim.state").write_bytes(b"")
    for name in ("calls.lock", "calls.gate", "leader.lock", ".checkpoint.json.ab12cd34.tmp"):  # locks, a killed write
        (state / name).write_bytes(b"")
    (state / "registered").mkdir()  # the instances the kubelet registered (a rolling upgrade's hand-over)
    (state / "registered" / "5d0a301a-178e-4c9d-870e-1f4919e15e23").write_bytes(b"")
    cp = Checkpoint(str(state / "checkpoint.json"), None)
    prepared = PreparedClaim("default", "c", uid, (PreparedGpu(0, "GPU-0", 0, 1 << 30, 50),),
                             (PreparedDevice(("gpu",), "node-a", "gpu-0"),))
    cp.set(uid, Entry(PREPARE_COMPLETED, "default", "c", prepared))
    cp.compact()  # as a plugin leaves it at shutdown: the file, and an empty journal beside it
    cdi_root.mkdir()
    (cdi_root / f"k8s.gpushare.dev-claim_{uid}.json").write_text("{}")
    for claim, claims in (("9a7c5e3b-2d1f-4e6a-8b0c-7d9e1f3a5b7c", state / "claims"),  # ours: the record lost
                          (OTHER_RUN, tmp_path / "other-state" / "claims")):
        (cdi_root / f"k8s.gpushare.dev-claim_{claim}.json").write_text(json.dumps({
            "cdiVersion": "0.6.0", "kind": "k8s.gpushare.dev/claim", "devices": [], "containerEdits": {"mounts": [
                {"hostPath": f"{claims}/{claim}/limits", "containerPath": "/var/run/gpushare/limits"}]}}))
    (cdi_root / "nvidia.yaml").write_text("kind: nvidia.com/gpu\n")
    src = tmp_path / "libgpushare.so"
    for build in (b"one", b"two"):
        src.write_bytes(build)
        install_versioned(src, hook, "libgpushare.so")
        install_versioned(src, hook / "sim", "libcuda.so.1")
    (hook / "README").write_text("the operator's own file")
    return state, cdi_root, hook
