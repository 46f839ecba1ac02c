"""SliceController against an API server that trickles its answers (issue 40): each request's
30 s timeout is per read, so a server sending a byte every 0.5 s held a pass of the loop for as
long as it liked (the slices of a node waited behind it). A pass now ends within PASS_TIMEOUT_S
all told, is retried with backoff, and publishes as soon as the server answers again."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from dra_driver.controller import Backoff, SliceController, reconciler
from playground.claims import DRIVER, NODE
from tests.support.hostile import HostileFront

BOUND_S = 1.0  # the test's bound on one pass (60 s in production)


@pytest.fixture
def front(emulator):
    f = HostileFront(emulator.url)
    yield f
    f.close()


def test_a_trickling_server_holds_a_pass_no_longer_than_its_bound(front, gpus, monkeypatch):
    monkeypatch.setattr(reconciler, "PASS_TIMEOUT_S", BOUND_S)
    front.turn("trickle")
    cfg = client.Configuration()
    cfg.host = front.url
    ctrl = SliceController(client.ApiClient(cfg), DRIVER, NODE, gpus.backend(), gpu_poll_interval=0.2)
    ctrl.backoff = Backoff(0.05, 0.25)
    ctrl.start()
    try:
        assert not ctrl.wait_synced(BOUND_S * 2)  # passes fail at the bound and are retried
        front.turn("pass")
        started = time.monotonic()
        assert ctrl.wait_synced(BOUND_S * 10), "not published after the server answered again"
        took = time.monotonic() - started
        print(f"slices published {took:.2f} s after a trickling server answered again (pass bound {BOUND_S:g} s)")
        assert took < BOUND_S * 2
    finally:
        ctrl.stop()
