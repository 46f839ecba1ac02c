"""Crash safety: the plugin as a subprocess, SIGKILLed at every step of Prepare and Unprepare
(GPUSHARE_FAULT_POINT), restarted; the kubelet stand-in retries. Every claim ends prepared
exactly once or cleanly absent: no orphan spec, claim folder or checkpoint entry."""

from __future__ import annotations

import glob
import os
import random
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from kubeletplugin import checkpoint as ckpt
from kubeletplugin.faults import PREPARE_STEPS, UNPREPARE_STEPS
from kubeletplugin.instances import LOCK_FILES
from playground.claims import make_claim, result
from playground.containers import PodmanRunner
from playground.kubelet import Kubelet
from tests.support.cdi import duplicate_devices, podman_run
from tests.support.plugin import GPUSHARE_DRA, PluginProcess, on_disk, recorded


@pytest.fixture(scope="module")
def kubeconfig(shared_emulator, tmp_path_factory):
    return shared_emulator.write_kubeconfig(str(tmp_path_factory.mktemp("kc") / "kubeconfig"))


@pytest.fixture
def plugin_process(dirs, hook_dir, kubeconfig):
    p = PluginProcess(dirs, hook_dir, kubeconfig)
    yield p
    p.kill()


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
    state = on_disk(dirs, claim.uid)
    assert state in ((True, True, ckpt.PREPARE_COMPLETED), (False, False, None)), state
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    answer = kubelet.prepare(claim).claims[claim.uid]
    assert answer.error == "" and answer.devices[0].device_name == "gpu-0-share-1"
    assert_prepared_once(dirs, claim.uid)
    assert kubelet.unprepare(claim).claims[claim.uid].error == ""
    assert_absent(dirs, claim.uid)
    kubelet.close()
    assert plugin_process.terminate() == 0


@pytest.mark.parametrize("step", UNPREPARE_STEPS)
def test_kill_during_unprepare(api, dirs, plugin_process, step):
    claim = make_claim(api, [result("gpu-0-share-2")])
    plugin_process.start()
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    assert kubelet.prepare(claim).claims[claim.uid].error == ""
    kubelet.close()
    assert plugin_process.terminate() == 0
    plugin_process.start(fault=step)
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    with pytest.raises(grpc.RpcError):
        kubelet.unprepare(claim)
    plugin_process.wait_killed()
    kubelet.close()
    plugin_process.start()
    state = on_disk(dirs, claim.uid)
    assert state in ((True, True, ckpt.PREPARE_COMPLETED), (False, False, None)), state
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    assert kubelet.unprepare(claim).claims[claim.uid].error == ""
    assert_absent(dirs, claim.uid)
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


@pytest.mark.parametrize("flag", ["--state-dir", "--cdi-root"])
def test_a_folder_that_cannot_be_made_is_one_line(dirs, hook_dir, kubeconfig, tmp_path, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    flags = dirs.flags(hook_dir) + [flag, str(blocker / "sub")]  # a later flag wins
    proc = subprocess.run([GPUSHARE_DRA, "kubelet-plugin", "--kubeconfig", kubeconfig, *flags],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (f"gpushare-dra kubelet-plugin: error: {flag}: cannot create "
                                   f"'{blocker / 'sub'}': '{blocker}' is not a folder"), proc.stderr
    assert not os.path.exists(dirs.root) or os.listdir(dirs.root) == []  # nothing made, nothing served


ROUNDS = 5  # a fresh random seed each run covers other kill points
CLAIMS = 12


def leftovers(dirs) -> list[str]:
    """Temporary files a kill left behind (removed by the next start)."""
    folders = [dirs.cdi, dirs.state, *glob.glob(os.path.join(dirs.state, "claims", "*"))]
    return [os.path.join(f, e) for f in folders if os.path.isdir(f) for e in os.listdir(f) if e.endswith(".tmp")]


def assert_exactly(dirs, prepared: set[str]) -> None:
    """One spec and one folder per prepared claim, nothing else, and the checkpoint agrees."""
    assert sorted(os.listdir(dirs.cdi)) == sorted(f"k8s.gpushare.dev-claim_{uid}.json" for uid in prepared)
    assert sorted(os.listdir(os.path.join(dirs.state, "claims"))) == sorted(prepared)
    left = set(os.listdir(dirs.state))
    assert left <= {"checkpoint.json", "checkpoint.json.journal", "claims", "sim.state", *LOCK_FILES}, left
    assert {uid: e.state for uid, e in recorded(dirs).items()} == {uid: ckpt.PREPARE_COMPLETED for uid in prepared}
    for uid in prepared:
        assert sorted(os.listdir(os.path.join(dirs.state, "claims", uid))) == \
            ["control-0", "ld.so.preload", "limits", "prepared.json", "region"]
    assert duplicate_devices(dirs.cdi) == []


def call(kubelet, claim, prepare: bool) -> str:
    if prepare:
        return kubelet.prepare(claim, timeout=60).claims[claim.uid].error
    return kubelet.unprepare(claim, timeout=60).claims[claim.uid].error


def test_random_sigkill_during_many_calls(api, dirs, plugin_process, hook_dir):
    """The issue's attack: SIGKILL at random points while many claims are prepared and
    unprepared, the kubelet retrying each (or, its pod gone, unpreparing instead). After every
    round: exactly one spec per prepared claim, no temporary or orphan file, no device defined
    twice; at the end podman itself accepts four of the specs."""
    seed = int(os.environ.get("GPUSHARE_CRASH_SEED") or int.from_bytes(os.urandom(4), "big"))  # to replay a failure
    rng = random.Random(seed)
    devices = [f"gpu-{n % 4}-share-{n // 4}" for n in range(CLAIMS)]
    claims = [make_claim(api, [result(d)]) for d in devices]
    device_of = {c.uid: d for c, d in zip(claims, devices, strict=True)}
    prepared: set[str] = set()
    killed_mid_write = interrupted = 0
    for round_ in range(ROUNDS):
        plugin_process.start()
        kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
        wanted = {c: rng.random() < 0.6 for c in claims}
        with ThreadPoolExecutor(CLAIMS) as pool:
            calls = [pool.submit(call, kubelet, c, wanted[c]) for c in claims]
            time.sleep(rng.uniform(0.0, 0.25))
            plugin_process.kill()  # SIGKILL
            for f in calls:
                try:
                    assert f.result() == ""
                except grpc.RpcError:
                    interrupted += 1
        kubelet.close()
        killed_mid_write += len(leftovers(dirs))
        plugin_process.start()
        assert leftovers(dirs) == [], f"seed {seed}"
        kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
        for c in claims:  # the kubelet's retries; a pod deleted meanwhile turns a Prepare into an Unprepare
            if rng.random() < 0.2:
                wanted[c] = not wanted[c]
            assert call(kubelet, c, wanted[c]) == "", f"seed {seed}"
        kubelet.close()
        prepared = {c.uid for c in claims if wanted[c]}
        try:
            assert_exactly(dirs, prepared)
        except AssertionError as e:
            raise AssertionError(f"seed {seed} (GPUSHARE_CRASH_SEED), round {round_}: {e}") from None
        assert plugin_process.terminate() == 0
    print(f"seed {seed}: {interrupted} calls cut by kills, {killed_mid_write} temporary files left behind "
          f"over {ROUNDS} rounds, all removed at start")
    why_not = PodmanRunner.available()
    if why_not or shutil.which("busybox") is None or shutil.which("unshare") is None:
        pytest.skip(f"podman check: {why_not or 'busybox or unshare missing'}")
    runner = PodmanRunner()
    try:
        for uid in rng.sample(sorted(prepared), min(4, len(prepared))):  # a podman run costs ~1 s
            proc = podman_run(runner, dirs.cdi, [f"k8s.gpushare.dev/claim={uid}-{device_of[uid]}"],
                              ["/bin/sh", "-c", "true"])
            assert proc.returncode == 0, f"seed {seed}, claim {uid}: {proc.stderr}"
    finally:
        runner.close()
