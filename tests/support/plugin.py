"""The kubelet plugin as the plugin suites start it: in this process, on mock GPUs, its
folders under one short root (unix socket paths are limited to 107 bytes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from typing import IO, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kubernetes import client

from kubeletplugin import checkpoint as ckpt
from kubeletplugin.config import PluginConfig
from kubeletplugin.main import Plugin
from playground.claims import DRIVER, NODE

from . import BUILD

REAL_LIBRARY = str(BUILD / "libgpushare.so")
MPS_CONTROL = f"{sys.executable} -m playground.mpscontrol"  # the stand-in control daemon
# The suites put claims of any strategy on any GPU (MPS beside TimeSlicing: the operator's
# --mixed-strategies); tests/agent/test_strategies_apart.py runs without it.


class Dirs:
    """The plugin's folders (flags) under one root."""

    def __init__(self, root: str):
        self.root = root
        self.plugin = os.path.join(root, "plugin")
        self.registry = os.path.join(root, "registry")
        self.state = os.path.join(root, "state")
        self.cdi = os.path.join(root, "cdi")

    @property
    def dra_socket(self) -> str:
        return os.path.join(self.plugin, "dra.sock")

    @property
    def reg_socket(self) -> str:
        return os.path.join(self.registry, f"{DRIVER}-reg.sock")

    def flags(self, hook_dir: str, cdi_root: str | None = None) -> list[str]:
        return ["--node-name", NODE, "--plugin-dir", self.plugin, "--registry-dir", self.registry,
                "--state-dir", self.state, "--cdi-root", cdi_root or self.cdi, "--hook-dir", hook_dir,
                "--device-backend", "mock", "--mock-gpus", "4x16Gi", "--partitions", "4",
                "--no-publish-slices", "--metrics-addr", "", "--healthcheck-port", "0",
                "--mps-control", MPS_CONTROL, "--mixed-strategies"]


def plugin_config(dirs: Dirs, hook_dir: str, cdi_root: str | None = None, **changes: Any) -> PluginConfig:
    """The plugin's configuration on `dirs` (what Dirs.flags says), with `changes` (PluginConfig's fields)."""
    config = PluginConfig(
        node_name=NODE, plugin_dir=dirs.plugin, registry_dir=dirs.registry, state_dir=dirs.state,
        cdi_root=cdi_root or dirs.cdi, hook_dir=hook_dir, device_backend="mock", mock_gpus="4x16Gi", partitions=4,
        publish_slices=False, metrics_addr="", healthcheck_port=0, mps_control=tuple(MPS_CONTROL.split()),
        mixed_strategies=True)
    return replace(config, **changes)


def launch_plugin(api: client.ApiClient, dirs: Dirs, hook_dir: str, cdi_root: str | None = None,
                  backend: Any = None, **changes: Any) -> Plugin:
    """A started plugin in this process; the caller stops it. `backend`: instead of the one the
    config names (mock GPUs with a --driver-root, which the flags refuse)."""
    return Plugin(plugin_config(dirs, hook_dir, cdi_root, **changes), api=api, backend=backend).start()


GPUSHARE_DRA = os.path.join(os.path.dirname(sys.executable), "gpushare-dra")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PluginProcess:
    """`gpushare-dra kubelet-plugin` as a subprocess on `dirs` (one simulated GPU state per
    process), as a DaemonSet pod runs it; with `pod_uid`, its sockets carry the UID, and on SIGTERM
    it waits up to `handover_timeout` seconds for a successor's registration."""

    def __init__(self, dirs: Dirs, hook_dir: str, kubeconfig: str, pod_uid: str = "",
                 handover_timeout: float = 2.0, extra: tuple[str, ...] = ()) -> None:
        """`extra`: flags after Dirs.flags (a later flag wins)."""
        self.dirs, self.hook_dir, self.kubeconfig, self.pod_uid = dirs, hook_dir, kubeconfig, pod_uid
        self.handover_timeout = handover_timeout
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        part = f"-{pod_uid}" if pod_uid else ""
        self.dra_socket = os.path.join(dirs.plugin, f"dra{part}.sock")
        self.reg_socket = os.path.join(dirs.registry, f"{DRIVER}{part}-reg.sock")

    def start(self, fault: str | None = None, wait: bool = True) -> None:
        # faulthandler: a plugin that hangs is sent SIGABRT and prints every thread's stack
        # PYTHONPATH: this checkout's code, not wherever the console script's editable install points
        path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
        env = {k: v for k, v in os.environ.items() if k != "GPUSHARE_FAULT_POINT"} | {
            "PYTHONFAULTHANDLER": "1", "PYTHONPATH": path}
        if fault:
            env["GPUSHARE_FAULT_POINT"] = fault
        flags = self.dirs.flags(self.hook_dir)
        if self.pod_uid:
            flags += ["--pod-uid", self.pod_uid, "--handover-timeout", str(self.handover_timeout)]
        flags += self.extra
        # its log goes to a file: a pipe nobody reads while it runs would fill and block it
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([GPUSHARE_DRA, "kubelet-plugin", "--kubeconfig", self.kubeconfig, "--log-format",
                                      "json", *flags], env=env, stdout=subprocess.DEVNULL, stderr=self._log)
        if wait:
            self.wait_serving()

    def wait_serving(self, timeout: float = 30) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            if os.path.exists(self.reg_socket):
                with grpc.insecure_channel(f"unix://{self.dra_socket}") as ch:
                    try:
                        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
                        return
                    except grpc.RpcError:
                        pass
            time.sleep(0.05)
        raise AssertionError(f"plugin did not start; its output:\n{self.output()[-6000:]}")

    def output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def _wait(self, what: str) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(timeout=10)
            raise AssertionError(f"the plugin did not {what} within 30 s; its last output:\n"
                                 f"{self.output()[-6000:]}") from None

    def wait_killed(self) -> None:
        assert self._wait("reach its fault point") == -signal.SIGKILL

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self._wait("stop on SIGTERM")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def recorded(dirs: Dirs) -> dict[str, ckpt.Entry]:
    """The checkpoint's entries as a restarted plugin reads them (the file and its journal)."""
    return ckpt.Checkpoint(os.path.join(dirs.state, "checkpoint.json"), None).on_disk()


def on_disk(dirs: Dirs, uid: str) -> tuple[bool, bool, str | None]:
    """A claim's state on the node: (spec exists, claim folder exists, checkpoint state)."""
    spec = os.path.exists(os.path.join(dirs.cdi, f"k8s.gpushare.dev-claim_{uid}.json"))
    folder = os.path.exists(os.path.join(dirs.state, "claims", uid))
    entry = recorded(dirs).get(uid)
    return spec, folder, entry.state if entry else None
