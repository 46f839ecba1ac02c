"""The agent sees MPS server restarts (issue 20; docs/strategies.md, MPS; kubeletplugin/agent/mpswatch.py).

A client's fatal GPU fault ends the MPS server of every MPS claim on the GPU; the agent follows
the GPU's control.log and posts one Warning Event on each MPS claim of that GPU and counts
gpushare_mps_server_restarts_total{gpu}. The node runs the plugin with the stand-in control
daemon (playground/mpscontrol.py), whose test-only gpushare_simulate_server_fault
makes a server exit as a faulted real one does. A later fault works as a marker: the agent reads
a log in order, so once it has counted the marker it has read every line before it."""

from __future__ import annotations

import os
import sys
from uuid import uuid4

import pytest
from kubernetes import client

from kubeletplugin.agent.mpswatch import REASON, ControlLog, LogTail, ServerExit
from kubeletplugin.strategies.mps import layout as mpslayout
from kubeletplugin.strategies.mps.control import MpsControl
from playground.claims import gpushare_config, make_claim, opaque_config, result
from playground.mpscontrol import SIMULATE_FAULT, Daemon, log_line
from tests.support import wait_for

MPS = [opaque_config(gpushare_config(sharingStrategy="MPS"))]
STAND_IN = [sys.executable, "-m", "playground.mpscontrol"]
METRIC = "gpushare_mps_server_restarts_total"


# ---- the log, line by line ---------------------------------------------------------------------
# Lines in the layout real daemons wrote (the sources are cited in kubeletplugin/strategies/mps/layout.py):
# control pid right-aligned in 5 columns, the server start logged from the new server's pid.
REAL_FORMAT = """\
[2026-03-02 10:14:07.201 Control   412] Starting control daemon using socket /tmp/nvidia-mps/control
[2026-03-02 10:14:31.540 Control   412] NEW CLIENT 5120 from user 1000: Server is not ready, push client to pending list
[2026-03-02 10:14:31.541 Control  5122] Starting new server 5122 for user 1000
[2026-03-02 10:14:31.602 Control   412] NEW SERVER 5122: Ready
[2026-03-02 10:20:55.017 Control   412] Server encountered a fatal exception. Shutting down
[2026-03-02 10:20:55.020 Control   412] Server 5122 exited with status 1
[2026-03-02 10:20:55.021 Control   412] Starting new server 5180 for user 1000
[2026-03-02 10:20:55.083 Control   412] NEW SERVER 5180: Ready
[2026-03-02 11:02:13.900 Control   412] Server 5180 exited with status 0
[2026-03-02 11:05:40.114 Control 11107] Server 5201 exited with status 139
[2026-03-02 11:05:41.114 Control 11107] Server 5202 exited with status -9
[2026-03-02 11:05:42.114 Control 11107] Server 5203 exited with status killed
[2026-03-02 11:06:00.000 Control 11107] Server encountered a fatal exception. Shutting down
[2026-03-02 11:06:00.100 Control 11107] Server 5204 exited with status 0
[2026-03-02 11:07:00.000 Control 11107] Server 5205 exited with status 0
"""


def test_parser_reads_real_format_lines():
    parser = ControlLog()
    exits = [e for line in REAL_FORMAT.splitlines() if (e := parser.feed(line))]
    assert exits == [ServerExit(5122, "1", True), ServerExit(5180, "0", False), ServerExit(5201, "139", True),
                     ServerExit(5202, "-9", True), ServerExit(5203, "killed", True),
                     ServerExit(5204, "0", True),   # status 0, but after a fatal exception
                     ServerExit(5205, "0", False)]  # the fatal line was answered by the exit before
    assert parser.server == 5180


@pytest.mark.parametrize("line", [
    "Server 7 exited with status 1",                                                 # no header: not the daemon's
    "[2026-03-02 11:07:00.000 Control 11107] Command: Server 7 exited with status 1",  # a command's record
    "[2026-03-02 11:07:00.000 Control 11107] Server 7 exited with status 1 and more",
    "[2026-03-02 11:07:00.000 Control 11107] Server x exited with status 1",
    "",
])
def test_parser_ignores_what_is_not_a_server_exit(line):
    assert ControlLog().feed(line) is None


def test_stand_in_writes_what_the_parser_reads():
    """The stand-in's lines (mpslayout's templates in its log_line layout) parse as the real ones."""
    lines: list[str] = []
    daemon = Daemon(log=lambda message, pid: lines.append(log_line(message, pid)))
    daemon.handle("start_server -uid 0")
    (first,) = daemon.servers
    reply, _ = daemon.handle(f"{SIMULATE_FAULT} {first}")
    second = int(reply)
    assert list(daemon.servers) == [second]
    daemon.handle(f"{SIMULATE_FAULT} {second} -9")
    daemon.handle(f"{mpslayout.QUIT}")
    parser = ControlLog()
    assert [e for line in "".join(lines).splitlines() if (e := parser.feed(line))] == [
        ServerExit(first, "1", True), ServerExit(second, "-9", True), ServerExit(second + 1, "0", False)]
    assert daemon.handle(f"{SIMULATE_FAULT} 1")[0].startswith("Error")  # no such server
    assert daemon.handle(f"{SIMULATE_FAULT} {second + 1} 0")[0].startswith("Error")  # a fault is never status 0


def test_tail_follows_appends_truncation_and_a_new_file(tmp_path):
    path = tmp_path / "control.log"
    path.write_text("old 1\nold 2\n")
    tail = LogTail(str(path), from_end=True)
    assert tail.read() == []  # what was there at start is not read
    with open(path, "a") as f:
        f.write("new 1\nnew ")
    assert tail.read() == ["new 1"]  # a line still being written waits
    with open(path, "a") as f:
        f.write("2\n")
    assert tail.read() == ["new 2"]
    path.write_text("a\n")  # truncated (shorter than what was read): from its start
    assert tail.read() == ["a"]
    replacement = tmp_path / "control.log.new"
    replacement.write_text("b 1\nb 2\nb 3\n")
    os.rename(replacement, path)  # recreated (another inode), longer than what was read
    assert tail.read() == ["b 1", "b 2", "b 3"]
    path.unlink()
    assert tail.read() == []
    path.write_text("c\n")  # a file there later is a new one
    assert tail.read() == ["c"]
    later = LogTail(str(tmp_path / "later.log"), from_end=True)
    assert later.read() == []
    (tmp_path / "later.log").write_text("d\n")  # absent at start: read from its start once there
    assert later.read() == ["d"]


def test_tail_goes_on_from_where_the_last_follower_saved(tmp_path):
    path, position = tmp_path / "control.log", str(tmp_path / "position")
    path.write_text("old\n")
    first = LogTail(str(path), from_end=True, position=position)
    with open(path, "a") as f:
        f.write("seen\nhalf")
    assert first.read() == ["seen"]
    first.save()  # dealt with: the next follower does not read it again
    with open(path, "a") as f:
        f.write(" done\nwhile none followed\n")
    assert LogTail(str(path), from_end=True, position=position).read() == ["half done", "while none followed"]
    replacement = tmp_path / "new.log"
    replacement.write_text("in another file\n")
    os.rename(replacement, path)  # the position names the old file: start at the new one's end
    assert LogTail(str(path), from_end=True, position=position).read() == []
    (tmp_path / "position").write_text("garbage")
    assert LogTail(str(path), from_end=True, position=position).read() == []


# ---- on a node: the plugin, its agent, the stand-in daemon, the API emulator -------------------
def events(node, ref) -> list:
    items = client.CoreV1Api(node.api).list_namespaced_event(ref.namespace).items
    return [e for e in items if e.involved_object.uid == ref.uid and e.reason == REASON]


def restarts(node, uuid: str) -> float | None:
    return next((v for labels, v in node.scrape().get(METRIC, {}).items() if dict(labels)["UUID"] == uuid), None)


class MpsNode:
    """The node's MPS claims, unprepared at the end: that quits the GPUs' control daemons, which
    are detached and would outlive the test."""

    def __init__(self, node):
        self.node = node
        self.refs: list = []
        self.control = MpsControl(node.dirs.state, STAND_IN)

    def claim(self, gpu: int = 0, config: list | None = MPS, pod: str | None = None):
        """`pod`: a pod UID the claim is reserved for (named `tenant`), as the scheduler writes it
        before Prepare."""
        if pod is None:
            ref, _ = self.node.claim(memory="1Gi", compute=25, gpu=gpu, config=config)
        else:
            ref = make_claim(self.node.api, [result(f"gpu-{gpu}", consumed={"memory": "1Gi", "compute": "25"})],
                             config=config)
            reserved = {"status": {"reservedFor": [{"resource": "pods", "name": "tenant", "uid": pod}]}}
            resource = client.ResourceV1Api(self.node.api)
            resource.patch_namespaced_resource_claim_status(ref.name, ref.namespace, reserved)
            assert not self.node.kubelet.prepare(ref).claims[ref.uid].error
        self.refs.append(ref)
        return ref

    def uuid(self, ref) -> str:
        return self.node.plugin.driver.prepared_claims()[ref.uid].gpus[0].uuid

    def server(self, uuid: str) -> str:
        """The GPU's server: started as a client's connection starts it."""
        self.control.command(uuid, "start_server -uid 0")
        return self.control.command(uuid, mpslayout.GET_SERVERS)[-1]

    def fault(self, uuid: str, server: str, status: int = 1) -> str:
        """A client's fatal fault ends the server; the daemon starts the next one."""
        (new,) = self.control.command(uuid, f"{SIMULATE_FAULT} {server} {status}")
        return new

    def close(self):
        for ref in self.refs:
            assert self.node.kubelet.unprepare(ref).claims[ref.uid].error == ""


@pytest.fixture
def mps(node):
    m = MpsNode(node)
    yield m
    m.close()


def reported(node, ref, server: str) -> list:
    """The claim's Events, once one names `server`'s exit. One thread sends the Events in the
    order the agent read the lines, so every line before that exit has been reported by then."""
    return wait_for(lambda: any(f"(pid {server})" in e.message for e in events(node, ref)) and events(node, ref),
                    what=f"an Event naming server {server}")


def test_a_server_fault_is_reported_on_each_mps_claim_of_its_gpu(mps):
    node = mps.node
    pod = str(uuid4())
    a, b = mps.claim(pod=pod), mps.claim()
    time_slicing = mps.claim(config=None)  # same GPU, not an MPS client
    other_gpu = mps.claim(gpu=1)           # an MPS claim of another GPU: another server
    uuid, uuid_1 = mps.uuid(a), mps.uuid(other_gpu)
    assert mps.uuid(time_slicing) == uuid != uuid_1
    mps.server(uuid_1)
    server = mps.server(uuid)
    marker = mps.fault(uuid, server)
    for ref in (a, b):
        (event,) = reported(node, ref, server)
        assert event.type == "Warning" and event.involved_object.kind == "ResourceClaim"
        assert event.involved_object.name == ref.name and event.metadata.namespace == ref.namespace
        assert uuid in event.message and "exited with status 1" in event.message
        assert "lost their GPU context and must restart" in event.message
    assert restarts(node, uuid) == 1 and restarts(node, uuid_1) == 0
    on_pod = wait_for(lambda: [e for e in client.CoreV1Api(node.api).list_namespaced_event(a.namespace).items
                               if e.involved_object.uid == pod and e.reason == REASON], what="the pod's Event")
    assert [(e.involved_object.kind, e.involved_object.name) for e in on_pod] == [("Pod", "tenant")]
    mps.fault(uuid, marker)  # once it is reported, so would have been anything wrong about the first
    reported(node, a, marker)
    assert events(node, time_slicing) == [] and events(node, other_gpu) == []


def test_a_normal_exit_is_not_reported(mps):
    node = mps.node
    ref = mps.claim()
    uuid = mps.uuid(ref)
    mps.control.command(uuid, f"shutdown_server {mps.server(uuid)}")  # exits with status 0
    marker = mps.server(uuid)
    mps.fault(uuid, marker, status=-9)
    (event,) = reported(node, ref, marker)
    assert "exited with status -9" in event.message
    assert restarts(node, uuid) == 1


def one_fault_reported(mps):
    """A claim, its GPU, and a server of that GPU (the marker) once a first fault is reported."""
    ref = mps.claim()
    uuid = mps.uuid(ref)
    first = mps.server(uuid)
    marker = mps.fault(uuid, first)
    reported(mps.node, ref, first)
    return ref, uuid, marker


def test_a_restarted_plugin_does_not_report_old_lines(mps):
    node = mps.node
    ref, uuid, marker = one_fault_reported(mps)
    assert restarts(node, uuid) == 1
    node.restart_plugin()  # the daemon is detached: it and its log outlive the plugin
    assert mps.control.command(uuid, mpslayout.GET_SERVERS) == [marker]
    assert restarts(node, uuid) == 0  # followed again, from where the last agent left off
    mps.fault(uuid, marker)
    assert len(reported(node, ref, marker)) == 2  # the first fault's Event, and the marker's
    assert restarts(node, uuid) == 1


def test_a_fault_while_no_agent_runs_is_reported_by_the_next(mps):
    """Between one plugin instance's stop and the next one's start (a restart, an upgrade) no agent
    reads the log; the next goes on from where the last left off, so the exit is still reported."""
    node = mps.node
    ref, uuid, marker = one_fault_reported(mps)
    node.restart_plugin(while_stopped=lambda: mps.fault(uuid, marker))
    assert len(reported(node, ref, marker)) == 2
    assert restarts(node, uuid) == 1  # this instance's count: the one it reported
