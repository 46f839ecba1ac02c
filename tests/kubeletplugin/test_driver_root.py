"""The kubelet plugin on the nvml backend with NVML from a driver root, as the DaemonSet runs it
(`--driver-root=/driver-root`): a subprocess (its NVML is its own) on a temporary driver root
holding the simulated NVML where a driver installs libnvidia-ml.so.1, against the shared API
emulator. It publishes the GPUs that NVML reports; a root without NVML stops it with one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from kubernetes import client

from dra_driver.discovery import SIM_DRIVER_VERSION, sim_uuid
from tests.support.nvml import driver_root, needs_sim, sim_nvml_env

GPUSHARE_DRA = os.path.join(os.path.dirname(sys.executable), "gpushare-dra")
NODE = "node-driver-root"


def plugin_command(tmp_path, kubeconfig: str, hook_dir: str, root) -> list[str]:
    short = tmp_path / "p"  # unix socket paths are limited to 107 bytes
    short.mkdir(exist_ok=True)
    return [GPUSHARE_DRA, "kubelet-plugin", "--kubeconfig", kubeconfig, "--node-name", NODE,
            "--device-backend", "nvml", "--driver-root", str(root), "--sharing-mode", "partition",
            "--partitions", "2", "--plugin-dir", str(short / "plugin"), "--registry-dir", str(short / "registry"),
            "--state-dir", str(short / "state"), "--cdi-root", str(short / "cdi"), "--hook-dir", hook_dir,
            "--metrics-addr", "", "--healthcheck-port", "0", "--log-format", "json"]


@pytest.fixture
def kubeconfig(shared_emulator, tmp_path):
    return shared_emulator.write_kubeconfig(str(tmp_path / "kubeconfig"))


@needs_sim
def test_plugin_publishes_the_gpus_nvml_reports_from_the_driver_root(tmp_path, api, kubeconfig, hook_dir):
    client.CoreV1Api(api).create_node(client.V1Node(metadata=client.V1ObjectMeta(name=NODE)))
    root = driver_root(tmp_path, "usr/lib64")
    env = sim_nvml_env(tmp_path / "sim.state", devices=2, memory=24 << 30)
    proc = subprocess.Popen(plugin_command(tmp_path, kubeconfig, hook_dir, root), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    resource = client.ResourceV1Api(api)
    try:
        devices: list = []
        deadline = time.monotonic() + 60  # a loaded 2-core machine: imports alone take seconds
        while not devices and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            slices = resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}").items
            devices = [d for s in slices for d in s.spec.devices or []]
            time.sleep(0.2)
        assert devices, "no ResourceSlice for the node"
        uuids = {d.attributes["uuid"].string for d in devices}
        assert uuids == {sim_uuid(0), sim_uuid(1)}  # the simulated NVML's GPUs, not mock ones
        assert len(devices) == 4  # 2 GPUs x 2 partitions
        assert {d.attributes["driverVersion"].version for d in devices} == {SIM_DRIVER_VERSION}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
        for s in resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}").items:
            resource.delete_resource_slice(s.metadata.name)
        client.CoreV1Api(api).delete_node(NODE)


def test_plugin_on_a_driver_root_without_nvml_stops_with_one_line(tmp_path, kubeconfig, hook_dir):
    root = driver_root(tmp_path, libdir=None)
    res = subprocess.run(plugin_command(tmp_path, kubeconfig, hook_dir, root), capture_output=True, text=True,
                         timeout=60, env=sim_nvml_env(tmp_path / "sim.state", devices=1, memory=16 << 30))
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"gpushare-dra kubelet-plugin: error: --driver-root: libnvidia-ml.so.1 not found under "
                           f"'{root}'; looked in {root}/libnvidia-ml.so.1, {root}/usr/lib64/libnvidia-ml.so.1, ")
    assert list((tmp_path / "p").iterdir()) == []  # nothing served, no state written
