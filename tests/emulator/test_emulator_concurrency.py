import threading
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client, watch

from tests.support import wait_for
from tests.support.emulator import pod_body

CLIENTS = 100
WATCHERS = 150


def test_concurrent_creates_and_conflicting_updates(emu):
    with emu.api_client() as api:
        client.CoreV1Api(api).create_node({"metadata": {"name": "shared",
                                                        "annotations": {"count": "0"}}})

    def worker(i):
        with emu.api_client() as api:
            core = client.CoreV1Api(api)
            core.create_namespaced_pod("default", pod_body(f"pod-{i}"))
            core.patch_namespaced_pod(f"pod-{i}", "default",
                                      {"metadata": {"labels": {"done": "yes"}}},
                                      _content_type="application/merge-patch+json")
            while True:  # optimistic concurrency: read, increment, write, retry on 409
                node = core.read_node("shared")
                node.metadata.annotations["count"] = str(int(node.metadata.annotations["count"])
                                                         + 1)
                try:
                    core.replace_node("shared", node)
                    return
                except client.ApiException as error:
                    assert error.status == 409

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(worker, range(CLIENTS)))
    with emu.api_client() as api:
        core = client.CoreV1Api(api)
        assert len(core.list_namespaced_pod("default", label_selector="done=yes").items) \
            == CLIENTS
        assert core.read_node("shared").metadata.annotations["count"] == str(CLIENTS)


def test_many_watches_and_closed_clients_are_noticed(emu, core):
    received = [[] for _ in range(WATCHERS)]
    streams = []

    def watcher(i):
        with emu.api_client() as api:
            w = watch.Watch()
            streams.append(w)
            for event in w.stream(client.CoreV1Api(api).list_namespaced_pod, "default"):
                received[i].append(event["raw_object"]["metadata"]["name"])
                if len(received[i]) == 3:
                    w.stop()
                    return

    threads = [threading.Thread(target=watcher, args=(i,), daemon=True)
               for i in range(WATCHERS)]
    for thread in threads:
        thread.start()
    wait_for(lambda: emu.store.watch_count() == WATCHERS, 20)
    for i in range(3):
        core.create_namespaced_pod("default", pod_body(f"pod-{i}"))
    for thread in threads:
        thread.join(20)
    assert all(r == ["pod-0", "pod-1", "pod-2"] for r in received)
    # Every client closed its connection; the server's watch threads notice and exit.
    wait_for(lambda: emu.store.watch_count() == 0, 5)
