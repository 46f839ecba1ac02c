"""GPU health end to end on a mock node: an XID injected into the simulated NVML taints the
GPU's devices in the ResourceSlices and reaches the kubelet's DRA health stream; both clear
after the quiet time."""

from __future__ import annotations

import os
import queue
import threading

import grpc
from kubernetes import client

from kubeletplugin.grpcapi import dra_health_v1alpha1_pb2 as pb
from kubeletplugin.grpcapi import dra_health_v1alpha1_pb2_grpc
from tests.support import wait_for


def taints(api, node: str) -> dict[str, list]:
    out = {}
    for s in client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={node}").items:
        for d in s.spec.devices:
            out[d.name] = [(t.key, t.value, t.effect) for t in d.taints or []]
    return out


class HealthStream:
    """The kubelet's side: NodeWatchResources over the DRA socket; `latest()` is the last answer."""

    def __init__(self, socket: str):
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.call = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(self.channel).NodeWatchResources(
            pb.NodeWatchResourcesRequest())
        self.answers: queue.Queue = queue.Queue()
        self.last: dict[str, tuple[int, str]] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for answer in self.call:
                self.answers.put({d.device.device_name: (d.health, d.message) for d in answer.devices})
        except grpc.RpcError:
            pass

    def latest(self) -> dict[str, tuple[int, str]]:
        while not self.answers.empty():
            self.last = self.answers.get()
        return self.last

    def close(self):
        self.call.cancel()
        self.channel.close()


def test_xid_taints_and_reports_then_recovers(api, node_factory):
    node = node_factory(publish_slices=True, sharing_mode="partition", health_recovery_seconds=3.0,
                        unhealthy_taint_effect="NoExecute")
    assert node.plugin.slices.wait_synced(20)
    assert all(t == [] for t in taints(api, "node-a").values())
    stream = HealthStream(node.dirs.dra_socket)
    try:
        first = wait_for(stream.latest)
        assert len(first) == 16 and {h for h, _ in first.values()} == {pb.HEALTHY}  # 4 GPUs x 4 shares
        events = os.path.join(node.dirs.state, "sim.state.events")
        with open(events, "a") as f:
            f.write("1 xid 13\n")  # the application's fault: no taint
            f.write("1 xid 79\n")
        gpu1 = [f"gpu-1-share-{j}" for j in range(4)]
        wait_for(lambda: all(taints(api, "node-a")[d] == [("gpushare.dev/unhealthy", "XID-79", "NoExecute")]
                             for d in gpu1), timeout=20)
        assert all(t == [] for d, t in taints(api, "node-a").items() if d not in gpu1)
        wait_for(lambda: all(stream.latest().get(d) == (pb.UNHEALTHY, "XID 79") for d in gpu1), timeout=20)
        assert stream.latest()["gpu-0-share-0"] == (pb.HEALTHY, "")
        m = node.scrape()
        uuid = "GPU-5ea1c0de-0000-4000-8000-000000000001"
        # `gpu` the index and `UUID` the uuid, as dcgm-exporter names them
        assert m["gpushare_gpu_unhealthy"] == {(("UUID", uuid), ("gpu", "1"), ("reason", "XID 79")): 1}
        assert m["gpushare_gpu_critical_events_total"] == {(("UUID", uuid), ("gpu", "1"), ("reason", "XID 79")): 1}
        # quiet for 3 s and the simulated GPU answers: healthy again
        wait_for(lambda: all(t == [] for t in taints(api, "node-a").values()), timeout=30)
        wait_for(lambda: all(stream.latest().get(d) == (pb.HEALTHY, "") for d in gpu1), timeout=20)
        assert "gpushare_gpu_unhealthy" not in node.scrape()  # no series while every GPU is healthy
    finally:
        stream.close()


def test_ignored_xid_leaves_the_gpu_healthy(api, node_factory):
    """--health-ignore-xids through the simulated NVML: XID 79 on GPU 1 is ignored, XID 94 on GPU 2
    still taints it."""
    node = node_factory(publish_slices=True, sharing_mode="partition", health_ignore_xids=frozenset({79, 48}))
    assert node.plugin.slices.wait_synced(20)
    with open(os.path.join(node.dirs.state, "sim.state.events"), "a") as f:
        f.write("1 xid 79\n")  # ignored: GPU 1 stays healthy
        f.write("2 xid 94\n")  # not ignored; the monitor reads the file in order, so GPU 1's came first
    gpu2 = [f"gpu-2-share-{j}" for j in range(4)]
    wait_for(lambda: all(taints(api, "node-a")[d] == [("gpushare.dev/unhealthy", "XID-94", "NoSchedule")]
                         for d in gpu2), timeout=20)
    assert all(t == [] for d, t in taints(api, "node-a").items() if d not in gpu2)
    uuid = "GPU-5ea1c0de-0000-4000-8000-000000000002"
    assert node.scrape()["gpushare_gpu_critical_events_total"] == {
        (("UUID", uuid), ("gpu", "2"), ("reason", "XID 94")): 1}
    assert node.plugin.gpu_health.unhealthy() == {uuid: "XID 94"}
