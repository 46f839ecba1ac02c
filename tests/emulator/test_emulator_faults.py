import threading
import time

import pytest
from kubernetes import client, watch

from tests.support import wait_for
from tests.support.emulator import pod_body, slice_body


def test_fail_next_then_success(core, emu):
    emu.faults.fail_next(2)
    for _ in range(2):
        with pytest.raises(client.ApiException) as err:
            core.list_node()
        assert err.value.status == 500
    assert core.list_node().items == []


def test_fail_matching_method_and_path_only(resource, emu):
    resource.create_resource_slice(slice_body())
    emu.faults.fail_next(1, status=409, method="PUT", path_contains="resourceslices")
    stored = resource.read_resource_slice("slice-a")  # a GET is not affected
    with pytest.raises(client.ApiException) as err:
        resource.replace_resource_slice("slice-a", stored)
    assert err.value.status == 409
    resource.replace_resource_slice("slice-a", stored)


def test_delay(core, emu):
    emu.faults.set_delay(0.3, path_contains="/pods")
    start = time.monotonic()
    core.list_namespaced_pod("default")
    assert time.monotonic() - start >= 0.3
    start = time.monotonic()
    core.list_node()
    assert time.monotonic() - start < 0.3
    emu.faults.set_delay(0, path_contains="/pods")
    start = time.monotonic()
    core.list_namespaced_pod("default")
    assert time.monotonic() - start < 0.3


def test_dropped_watch_ends_the_stream(core, emu):
    events = []
    done = threading.Event()

    def watcher():
        for event in watch.Watch().stream(core.list_namespaced_pod, "default",
                                          timeout_seconds=30):
            events.append(event["type"])
        done.set()

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    core.create_namespaced_pod("default", pod_body())
    wait_for(lambda: events, 5)
    emu.faults.drop_watches()
    assert done.wait(5) and events == ["ADDED"]


def test_next_watch_fails(core, emu):
    emu.faults.fail_next_watch(1, status=503)
    with pytest.raises(client.ApiException) as err:
        list(watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1))
    assert err.value.status == 503
    assert core.list_namespaced_pod("default").items == []  # plain requests unaffected
    emu.faults.fail_next(5)
    emu.faults.clear()
    core.list_node()


def test_request_log(core, emu):
    core.create_namespaced_pod("default", pod_body())
    core.read_namespaced_pod("pod-a", "default")
    list(watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1))
    assert emu.count_requests(writes_only=True) == 1
    assert emu.count_requests(method="GET", path_contains="/pods") == 2
    watch_records = [r for r in emu.requests if r.is_watch]
    assert len(watch_records) == 1 and "watch=true" in watch_records[0].query
    assert watch_records[0].status == 200
    emu.reset_requests()
    assert emu.requests == []
