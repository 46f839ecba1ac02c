"""GPU health from NVML events (kubeletplugin/health.py) against a fake pynvml (tests/support/nvml.py)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from dra_driver.discovery import make_backend
from dra_driver.log import configure
from kubeletplugin.health import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    HealthAwareBackend,
    HealthMonitor,
    classify,
)
from tests.support import wait_for
from tests.support.nvml import fake_pynvml


@pytest.mark.parametrize("event_type, data, reason", [
    (EVENT_XID, 79, "XID 79"),              # fell off the bus
    (EVENT_XID, 48, "XID 48"),              # double-bit ECC, as an XID
    (EVENT_XID, 13, None),                  # the application's illegal address
    (EVENT_XID, 43, None),                  # the application's context stopped
    (EVENT_DOUBLE_BIT_ECC, 0, "double-bit ECC error"),
    (EVENT_SINGLE_BIT_ECC, 0, None),        # corrected by the GPU
])
def test_classify(event_type, data, reason):
    assert classify(event_type, data) == reason


@pytest.mark.parametrize("event_type, data, reason", [
    (EVENT_XID, 79, None),                  # added by the operator
    (EVENT_XID, 13, None),                  # the application list still applies
    (EVENT_XID, 94, "XID 94"),              # not added
    (EVENT_DOUBLE_BIT_ECC, 0, "double-bit ECC error"),
])
def test_classify_with_added_xids(event_type, data, reason):
    assert classify(event_type, data, frozenset({79, 48})) == reason


@pytest.mark.parametrize("event_type, data, reason", [
    (EVENT_XID, 79, None),
    (EVENT_XID, 48, None),
    (EVENT_XID, 2**32 - 1, None),
    (EVENT_DOUBLE_BIT_ECC, 0, "double-bit ECC error"),  # not an XID: still critical
    (EVENT_XID | EVENT_DOUBLE_BIT_ECC, 48, "double-bit ECC error"),
])
def test_classify_with_all_xids_ignored(event_type, data, reason):
    assert classify(event_type, data, "all") == reason


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def nvml(monkeypatch):
    fake = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.fixture
def monitor(nvml):
    clock = Clock()
    m = HealthMonitor(recovery_s=60, wait_ms=20, clock=clock)
    m.clock_ = clock
    changes = []
    m.listeners.append(lambda: changes.append(m.unhealthy()))
    m.changes = changes
    assert m.start()
    yield m
    m.stop()


def test_critical_event_marks_the_gpu_and_discovery_shows_it(nvml, monitor):
    backend = HealthAwareBackend(make_backend("nvml"), monitor)
    assert nvml.registered == {0: EVENT_DOUBLE_BIT_ECC | EVENT_XID, 1: EVENT_DOUBLE_BIT_ECC | EVENT_XID}
    nvml.events.put((1, EVENT_XID, 13))  # application error: ignored
    nvml.events.put((0, EVENT_DOUBLE_BIT_ECC, 0))
    wait_for(lambda: monitor.changes)
    assert monitor.changes == [{"GPU-real-0": "double-bit ECC error"}]
    gpu0, gpu1 = backend.discover()
    assert (gpu0.healthy, gpu0.health_reason) == (False, "double-bit ECC error")
    assert gpu1.healthy


def test_recovery_needs_quiet_time_and_no_pending_retirement(nvml, monitor):
    nvml.pending_retirement.add(0)
    nvml.events.put((0, EVENT_XID, 79))
    wait_for(lambda: monitor.unhealthy())
    monitor.clock_.now += 30
    monitor.check_recovery()
    assert monitor.unhealthy() == {"GPU-real-0": "XID 79"}  # not quiet long enough
    monitor.clock_.now += 31
    monitor.check_recovery()
    assert monitor.unhealthy() == {"GPU-real-0": "XID 79"}  # retirement waits for a GPU reset
    nvml.pending_retirement.clear()  # the GPU was reset
    monitor.check_recovery()
    assert monitor.unhealthy() == {}
    assert monitor.changes == [{"GPU-real-0": "XID 79"}, {}]


def test_a_new_event_restarts_the_quiet_time(nvml, monitor):
    nvml.events.put((1, EVENT_XID, 79))
    wait_for(lambda: monitor.unhealthy())
    monitor.clock_.now += 50
    nvml.events.put((1, EVENT_XID, 79))
    wait_for(lambda: nvml.events.empty())
    time.sleep(0.1)  # the monitor thread records it
    monitor.clock_.now += 20
    monitor.check_recovery()
    assert monitor.unhealthy() == {"GPU-real-1": "XID 79"}


def test_a_discovery_failure_keeps_its_own_reason(nvml, monkeypatch, monitor):
    lost = fake_pynvml(lost_index=0)
    monkeypatch.setitem(sys.modules, "pynvml", lost)
    backend = HealthAwareBackend(make_backend("nvml"), monitor)
    monitor.record("unknown-0", EVENT_XID, 79)
    gpu0, _ = backend.discover()
    assert "GPU is lost" in gpu0.health_reason


def test_no_nvml_events_is_logged_not_fatal(monkeypatch):
    fake = fake_pynvml()

    def refuse():
        raise fake.NVMLError("Not Supported")

    fake.nvmlEventSetCreate = refuse
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    m = HealthMonitor()
    assert m.start() is False
    m.stop()


@pytest.mark.parametrize("ignored, gpu1", [
    (frozenset({79}), None),
    ("all", None),
    (frozenset({94}), "XID 79"),
])
def test_ignored_xids_leave_the_gpu_healthy(nvml, ignored, gpu1):
    m = HealthMonitor(recovery_s=60, wait_ms=20, ignored_xids=ignored)
    assert m.start()
    try:
        nvml.events.put((1, EVENT_XID, 79))
        nvml.events.put((0, EVENT_DOUBLE_BIT_ECC, 0))  # after the XID: once GPU 0 is marked, the XID was taken
        wait_for(lambda: "GPU-real-0" in m.unhealthy())
        expected = {"GPU-real-0": "double-bit ECC error"} | ({"GPU-real-1": gpu1} if gpu1 else {})
        assert m.unhealthy() == expected
    finally:
        m.stop()


@pytest.mark.parametrize("ignored, logged, added", [
    (frozenset(), [13, 31, 43, 45, 68, 109], []),
    (frozenset({94, 79}), [13, 31, 43, 45, 68, 79, 94, 109], [79, 94]),
    ("all", "all", "all"),
])
def test_start_logs_the_ignored_xids(nvml, capsys, ignored, logged, added):
    configure("info", "json")
    m = HealthMonitor(ignored_xids=ignored)
    assert m.start()
    m.stop()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    started = [entry for entry in lines if entry["event"] == "watching GPU health events"]
    assert len(started) == 1, lines
    assert (started[0]["ignored_xids"], started[0]["added_by_flag"], started[0]["gpus"]) == (logged, added, 2)
