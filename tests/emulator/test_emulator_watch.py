import threading
import time

import pytest
from kubernetes import client, watch

from playground.emulator import ApiEmulator
from tests.support.emulator import pod_body

MERGE = "application/merge-patch+json"


def collect(func, *args, **kwargs):
    return [(e["type"], e["raw_object"]["metadata"].get("name"))
            for e in watch.Watch().stream(func, *args, **kwargs)]


def test_live_added_modified_deleted(core):
    def writer():
        time.sleep(0.3)
        core.create_namespaced_pod("default", pod_body())
        core.patch_namespaced_pod("pod-a", "default", {"metadata": {"labels": {"x": "y"}}},
                                  _content_type=MERGE)
        core.delete_namespaced_pod("pod-a", "default")
        core.create_namespaced_pod("other", pod_body("pod-elsewhere"))

    thread = threading.Thread(target=writer)
    thread.start()
    events = collect(core.list_namespaced_pod, "default", timeout_seconds=2)
    thread.join()
    assert events == [("ADDED", "pod-a"), ("MODIFIED", "pod-a"), ("DELETED", "pod-a")]


def test_initial_state_then_resume_without_gaps_or_repeats(core):
    core.create_namespaced_pod("default", pod_body("pod-0"))
    assert collect(core.list_namespaced_pod, "default", resource_version="0",
                   timeout_seconds=1) == [("ADDED", "pod-0")]
    rvs = []
    for i in range(1, 5):
        rvs.append(core.create_namespaced_pod("default", pod_body(f"pod-{i}"))
                   .metadata.resource_version)
    events = collect(core.list_namespaced_pod, "default", resource_version=rvs[1],
                     timeout_seconds=1)
    assert events == [("ADDED", "pod-3"), ("ADDED", "pod-4")]


def test_watch_object_leaving_selector_is_deleted(core):
    rv = core.create_node({"metadata": {"name": "n"}}).metadata.resource_version  # RV "0" would
    core.create_namespaced_pod("default", pod_body(labels={"app": "a"}))  # mean "current state"
    core.patch_namespaced_pod("pod-a", "default", {"metadata": {"labels": {"app": "b"}}},
                              _content_type=MERGE)
    core.patch_namespaced_pod("pod-a", "default", {"metadata": {"labels": {"app": "a"}}},
                              _content_type=MERGE)
    events = collect(core.list_namespaced_pod, "default", label_selector="app=a",
                     resource_version=rv, timeout_seconds=1)
    assert events == [("ADDED", "pod-a"), ("DELETED", "pod-a"), ("ADDED", "pod-a")]


def test_too_old_resource_version_is_410():
    with ApiEmulator(history=3) as emu, emu.api_client() as api:
        core = client.CoreV1Api(api)
        for i in range(6):
            core.create_namespaced_pod("default", pod_body(f"pod-{i}"))
        # With timeout_seconds the client does not retry: the ERROR event raises at once.
        with pytest.raises(client.ApiException) as err:
            collect(core.list_namespaced_pod, "default", resource_version="1",
                    timeout_seconds=1)
        assert err.value.status == 410 and "Expired" in err.value.reason
        # Without it, the client retries once from the same RV, then raises.
        emu.reset_requests()
        with pytest.raises(client.ApiException) as err:
            collect(core.list_namespaced_pod, "default", resource_version="1")
        assert err.value.status == 410
        assert emu.count_requests(path_contains="/pods") == 2
        # The newest retained RVs still resume.
        assert len(collect(core.list_namespaced_pod, "default", resource_version="4",
                           timeout_seconds=1)) == 2


def test_bookmarks(core):
    core.create_namespaced_pod("default", pod_body())
    stream = watch.Watch().stream(core.list_namespaced_pod, "default",
                                  allow_watch_bookmarks=True, timeout_seconds=1)
    events = list(stream)
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert events[0]["type"] == "ADDED" and len(bookmarks) >= 2
    last_rv = int(events[0]["raw_object"]["metadata"]["resourceVersion"])
    assert int(bookmarks[-1]["raw_object"]["metadata"]["resourceVersion"]) >= last_rv


def test_watch_all_namespaces_and_cluster_scoped(core, resource):
    from tests.support.emulator import slice_body
    core.create_namespaced_pod("a", pod_body("p1"))
    core.create_namespaced_pod("b", pod_body("p2"))
    resource.create_resource_slice(slice_body())
    assert sorted(collect(core.list_pod_for_all_namespaces, timeout_seconds=1)) == [
        ("ADDED", "p1"), ("ADDED", "p2")]
    assert collect(resource.list_resource_slice, field_selector="spec.nodeName=node-a",
                   timeout_seconds=1) == [("ADDED", "slice-a")]
