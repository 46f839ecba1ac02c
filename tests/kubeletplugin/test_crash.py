"""Crash safety: the plugin as a subprocess, SIGKILLed at every step of Prepare and Unprepare
(GPUSHARE_FAULT_POINT), restarted; the kubelet stand-in retries. Every claim ends prepared
exactly once or cleanly absent: no orphan spec, claim folder or checkpoint entry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kubeletplugin import checkpoint as ckpt
from kubeletplugin.faults import PREPARE_STEPS, UNPREPARE_STEPS

from .kubelet import Kubelet, make_claim, result

GPUSHARE_DRA = os.path.join(os.path.dirname(sys.executable), "gpushare-dra")


@pytest.fixture(scope="module")
def kubeconfig(emulator, tmp_path_factory):
    return emulator.write_kubeconfig(str(tmp_path_factory.mktemp("kc") / "kubeconfig"))


class PluginProcess:
    def __init__(self, dirs, hook_dir, kubeconfig):
        self.dirs, self.hook_dir, self.kubeconfig = dirs, hook_dir, kubeconfig
        self.proc: subprocess.Popen | None = None

    def start(self, fault: str | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k != "GPUSHARE_FAULT_POINT"}
        if fault:
            env["GPUSHARE_FAULT_POINT"] = fault
        flags = self.dirs.flags(self.hook_dir)
        flags[flags.index("--metrics-addr") + 1] = ""
        self.proc = subprocess.Popen([GPUSHARE_DRA, "kubelet-plugin", "--kubeconfig", self.kubeconfig, "--log-format",
                                      "json", *flags], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read().decode()
            if os.path.exists(self.dirs.reg_socket):
                with grpc.insecure_channel(f"unix://{self.dirs.dra_socket}") as ch:
                    try:
                        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
                        return
                    except grpc.RpcError:
                        pass
            time.sleep(0.05)
        raise AssertionError("plugin did not start")

    def wait_killed(self) -> None:
        assert self.proc.wait(timeout=30) == -signal.SIGKILL

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def plugin_process(dirs, hook_dir, kubeconfig):
    p = PluginProcess(dirs, hook_dir, kubeconfig)
    yield p
    p.kill()


def on_disk(dirs, uid) -> tuple[bool, bool, str | None]:
    """(spec exists, claim folder exists, checkpoint state)."""
    spec = os.path.exists(os.path.join(dirs.cdi, f"k8s.gpushare.dev-claim_{uid}.json"))
    folder = os.path.exists(os.path.join(dirs.state, "claims", uid))
    try:
        with open(os.path.join(dirs.state, "checkpoint.json"), "rb") as f:
            claims, _ = ckpt.decode(f.read())
    except FileNotFoundError:
        claims = {}
    entry = claims.get(uid)
    return spec, folder, entry["state"] if entry else None


def assert_prepared_once(dirs, uid):
    assert on_disk(dirs, uid) == (True, True, ckpt.PREPARE_COMPLETED)
    assert os.listdir(dirs.cdi) == [f"k8s.gpushare.dev-claim_{uid}.json"]
    assert os.listdir(os.path.join(dirs.state, "claims")) == [uid]


def assert_absent(dirs, uid):
    assert on_disk(dirs, uid) == (False, False, None)
    assert os.listdir(dirs.cdi) == [] and os.listdir(os.path.join(dirs.state, "claims")) == []


@pytest.mark.parametrize("step", PREPARE_STEPS)
def test_kill_during_prepare(api, dirs, plugin_process, step):
    claim = make_claim(api, [result("gpu-0-share-1")])
    plugin_process.start(fault=step)
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    with pytest.raises(grpc.RpcError):
        kubelet.prepare(claim)
    plugin_process.wait_killed()
    kubelet.close()
    plugin_process.start()
    # After recovery, before the retry: prepared completely or not at all.
    state = on_disk(dirs, claim[2])
    assert state in ((True, True, ckpt.PREPARE_COMPLETED), (False, False, None)), state
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    answer = kubelet.prepare(claim).claims[claim[2]]
    assert answer.error == "" and answer.devices[0].device_name == "gpu-0-share-1"
    assert_prepared_once(dirs, claim[2])
    assert kubelet.unprepare(claim).claims[claim[2]].error == ""
    assert_absent(dirs, claim[2])
    kubelet.close()
    assert plugin_process.terminate() == 0


@pytest.mark.parametrize("step", UNPREPARE_STEPS)
def test_kill_during_unprepare(api, dirs, plugin_process, step):
    claim = make_claim(api, [result("gpu-0-share-2")])
    plugin_process.start()
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    assert kubelet.prepare(claim).claims[claim[2]].error == ""
    kubelet.close()
    assert plugin_process.terminate() == 0
    plugin_process.start(fault=step)
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    with pytest.raises(grpc.RpcError):
        kubelet.unprepare(claim)
    plugin_process.wait_killed()
    kubelet.close()
    plugin_process.start()
    state = on_disk(dirs, claim[2])
    assert state in ((True, True, ckpt.PREPARE_COMPLETED), (False, False, None)), state
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    assert kubelet.unprepare(claim).claims[claim[2]].error == ""
    assert_absent(dirs, claim[2])
    kubelet.close()
    assert plugin_process.terminate() == 0


def test_sigterm_removes_sockets(dirs, plugin_process):
    plugin_process.start()
    assert plugin_process.terminate() == 0
    assert not os.path.exists(dirs.dra_socket) and not os.path.exists(dirs.reg_socket)


def test_missing_hook_library_fails_clearly(dirs, kubeconfig, tmp_path):
    flags = dirs.flags(str(tmp_path))
    proc = subprocess.run([GPUSHARE_DRA, "kubelet-plugin", "--kubeconfig", kubeconfig, *flags],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--hook-dir" in proc.stderr
