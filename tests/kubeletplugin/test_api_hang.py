"""Prepare while the API server hangs (issue 26): a claim not in the plugin's cache is read from
the API server. A server that accepts the connection and never answers held Prepare for 80 s
(urllib3 repeated the timed-out GET three times: 4 x 20 s), long after the kubelet gave up on the
call (45 s). It must fail within the kubelet's timeout, once, with one error naming the API
server, and succeed on the next call once the server answers."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from kubeletplugin import driver as driver_module
from playground.claims import make_claim, result
from playground.kubelet import Kubelet
from tests.support.hostile import HostileFront
from tests.support.plugin import launch_plugin

KUBELET_PREPARE_TIMEOUT_S = 45  # the kubelet's deadline for one NodePrepareResources call
READ_TIMEOUT_S = 2.0  # the driver's read timeout in this test (20 s in production)


@pytest.fixture
def gate(shared_emulator):
    """A front of the API server that accepts connections and never answers, until turned to pass."""
    g = HostileFront(shared_emulator.url)
    g.turn("silent")
    yield g
    g.close()


def test_prepare_under_a_hanging_api_server_fails_in_time_then_succeeds(api, gate, dirs, hook_dir, monkeypatch):
    assert driver_module.API_TIMEOUT_S * 1.5 < KUBELET_PREPARE_TIMEOUT_S  # the production figure, with a margin
    monkeypatch.setattr(driver_module, "API_TIMEOUT_S", READ_TIMEOUT_S)
    cfg = client.Configuration()
    cfg.host = gate.url
    plugin = launch_plugin(client.ApiClient(cfg), dirs, hook_dir)
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    try:
        ref = make_claim(api, [result("gpu-0-share-0")])  # written straight to the server: not cached
        started = time.monotonic()
        answer = kubelet.prepare(ref, timeout=KUBELET_PREPARE_TIMEOUT_S).claims[ref.uid]
        took = time.monotonic() - started
        print(f"Prepare under a hung API server: failed after {took:.1f} s (read timeout {READ_TIMEOUT_S} s)")
        assert answer.error, answer
        assert "API server" in answer.error and gate.url in answer.error and "did not answer" in answer.error, \
            answer.error
        assert answer.error.count("\n") == 0  # one error, not one per attempt
        assert took < READ_TIMEOUT_S * 1.5, took  # one read, not four
        gate.turn("pass")
        answer = kubelet.prepare(ref, timeout=KUBELET_PREPARE_TIMEOUT_S).claims[ref.uid]
        assert answer.error == "" and answer.devices, answer
    finally:
        kubelet.close()
        plugin.stop(grace=1)
