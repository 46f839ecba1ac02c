"""A rolling upgrade with no gap (--pod-uid, kubelet 1.33+; docs/operations.md, Upgrade).

The new plugin pod starts while the old one serves, on the same state dir; the kubelet's plugin
manager (stand-in: playground.kubelet.PluginManager) registers both and calls the
newest connected one; the old pod gets SIGTERM. Claims are prepared and unprepared all the
while, from several threads as the kubelet's pod workers do: no call fails, no claim is lost
or left half-done, and the node agent moves to the new pod once the old one has stopped.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import grpc
import pytest

from kubeletplugin import checkpoint as ckpt
from playground.claims import DRIVER, make_claim, result
from playground.kubelet import PluginManager
from tests.support import wait_for
from tests.support.plugin import PluginProcess, on_disk

WORKERS = 4
TAKE_OVER = "this one runs the node agent now"


@pytest.fixture(scope="module")
def kubeconfig(shared_emulator, tmp_path_factory):
    return shared_emulator.write_kubeconfig(str(tmp_path_factory.mktemp("kc") / "kubeconfig"))


@pytest.fixture
def pods(dirs, hook_dir, kubeconfig):
    """The old and the new pod of the DaemonSet: two plugin processes, each with its pod UID."""
    old, new = (PluginProcess(dirs, hook_dir, kubeconfig, pod_uid=str(uuid.uuid4())) for _ in range(2))
    yield old, new
    old.kill()
    new.kill()


class Traffic:
    """Each worker flips its claims between prepared and unprepared through the kubelet."""

    def __init__(self, kubelet: PluginManager, claims: list) -> None:
        self.kubelet = kubelet
        self.prepared = {c.uid: False for c in claims}  # the kubelet's view of each claim
        self.calls = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, args=(claims[i::WORKERS],)) for i in range(WORKERS)]

    def start(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def _work(self, claims: list) -> None:
        while not self._stop.is_set():
            for claim in claims:
                call = self.kubelet.unprepare if self.prepared[claim.uid] else self.kubelet.prepare
                try:
                    error = call(claim).claims[claim.uid].error
                except (grpc.RpcError, LookupError) as e:
                    error = f"{type(e).__name__}: {e}"
                self.calls += 1
                if error:
                    self.failures.append(f"{call.__name__} {claim.name}: {error}")
                else:
                    self.prepared[claim.uid] = not self.prepared[claim.uid]


def test_upgrade_under_continuous_calls_fails_none_and_loses_none(api, dirs, pods):
    old, new = pods
    claims = [make_claim(api, [result(f"gpu-{i // 4}-share-{i % 4}")]) for i in range(16)]
    old.start()
    kubelet = PluginManager(dirs.registry, DRIVER).start()
    try:
        wait_for(lambda: kubelet.endpoints() == [old.dra_socket])
        traffic = Traffic(kubelet, claims).start()
        try:
            wait_for(lambda: traffic.calls > 50, timeout=30)
            # the new pod starts beside the old one: it recovers between the old one's calls
            new.start()
            wait_for(lambda: kubelet.endpoints() == [old.dra_socket, new.dra_socket])
            served_by_new = kubelet.calls_by_endpoint.get(new.dra_socket, 0)
            wait_for(lambda: kubelet.calls_by_endpoint.get(new.dra_socket, 0) > served_by_new + 50, timeout=30)
            assert TAKE_OVER not in new.output()  # the old pod still runs the node agent
            # the DaemonSet deletes the old pod: SIGTERM
            assert old.terminate() == 0, old.output()[-3000:]
            wait_for(lambda: kubelet.endpoints() == [new.dra_socket])
            wait_for(lambda: TAKE_OVER in new.output(), timeout=10)
            calls = traffic.calls
            wait_for(lambda: traffic.calls > calls + 50, timeout=30)
        finally:
            traffic.stop()
        assert traffic.failures == [], traffic.failures[:5]
        assert kubelet.calls_by_endpoint.get(old.dra_socket, 0) > 50, kubelet.calls_by_endpoint

        # nothing lost, nothing half-done: the node holds exactly what the kubelet believes
        for claim in claims:
            want = (True, True, ckpt.PREPARE_COMPLETED) if traffic.prepared[claim.uid] else (False, False, None)
            assert on_disk(dirs, claim.uid) == want, (claim.name, traffic.prepared[claim.uid])
        # and the new pod knows every claim the old one prepared: it unprepares them all
        for claim in claims:
            if traffic.prepared[claim.uid]:
                assert kubelet.unprepare(claim).claims[claim.uid].error == ""
        assert os.listdir(dirs.cdi) == [] and os.listdir(os.path.join(dirs.state, "claims")) == []
        assert new.terminate() == 0
    finally:
        kubelet.close()


def test_a_stopping_plugin_serves_until_the_kubelet_registered_its_successor(api, dirs, hook_dir, kubeconfig):
    """The plugin pod deleted or evicted: SIGTERM while the DaemonSet starts the next pod. The old
    plugin serves on (its registration stays, calls are answered) until the kubelet registered the
    new one, so a pod created meanwhile is prepared at once: the real kubelet fails a prepare with
    no plugin registered and retries it only at its resync, 60 to 90 s later (docs/operations.md)."""
    old = PluginProcess(dirs, hook_dir, kubeconfig, pod_uid=str(uuid.uuid4()), handover_timeout=60)
    new = PluginProcess(dirs, hook_dir, kubeconfig, pod_uid=str(uuid.uuid4()))
    kubelet = PluginManager(dirs.registry, DRIVER).start()
    try:
        old.start()
        wait_for(lambda: kubelet.endpoints() == [old.dra_socket])
        assert old.proc is not None
        old.proc.send_signal(signal.SIGTERM)
        time.sleep(1.5)  # the kubelet reconciles every second: it would have deregistered by now
        assert old.proc.poll() is None, old.output()[-3000:]
        assert kubelet.endpoints() == [old.dra_socket]
        claim = make_claim(api, [result("gpu-0-share-0")])
        assert kubelet.prepare(claim).claims[claim.uid].error == ""
        new.start()
        assert old._wait("stop once its successor registered") == 0
        assert "the kubelet registered this node's next plugin; stopping" in old.output(), old.output()[-3000:]
        wait_for(lambda: kubelet.endpoints() == [new.dra_socket])
        assert kubelet.unprepare(claim).claims[claim.uid].error == ""  # the new one knows the claim
    finally:
        kubelet.close()
        old.kill()
        new.kill()


def test_a_stopping_plugin_without_a_successor_stops_after_the_handover_timeout(dirs, hook_dir, kubeconfig):
    """The DaemonSet deleted (uninstall) or the node going down: no successor comes."""
    plugin = PluginProcess(dirs, hook_dir, kubeconfig, pod_uid=str(uuid.uuid4()), handover_timeout=1)
    kubelet = PluginManager(dirs.registry, DRIVER).start()
    try:
        plugin.start()
        wait_for(lambda: kubelet.endpoints() == [plugin.dra_socket])
        start = time.monotonic()
        assert plugin.terminate() == 0
        assert 1 <= time.monotonic() - start < 20, time.monotonic() - start
        assert "no other plugin registered on this node; stopping" in plugin.output()
        assert os.listdir(os.path.join(dirs.state, "registered")) == []  # its record goes with it
    finally:
        kubelet.close()
        plugin.kill()


def test_a_pod_uid_that_is_not_one_is_refused(dirs, hook_dir, kubeconfig):
    proc = PluginProcess(dirs, hook_dir, kubeconfig, pod_uid="../../etc")
    proc.start(wait=False)
    assert proc.proc is not None and proc.proc.wait(timeout=60) == 2
    out = proc.output()
    assert "--pod-uid" in out and "'../../etc' is not a pod UID" in out, out
    assert not os.path.exists(dirs.registry) or os.listdir(dirs.registry) == []


def test_without_a_pod_uid_the_sockets_keep_their_names(dirs, hook_dir, kubeconfig):
    proc = PluginProcess(dirs, hook_dir, kubeconfig)
    proc.start()
    try:
        assert sorted(os.listdir(dirs.registry)) == [f"{DRIVER}-reg.sock"]
        assert "dra.sock" in os.listdir(dirs.plugin)
    finally:
        assert proc.terminate() == 0
    assert os.listdir(dirs.registry) == []  # a clean stop removes them
