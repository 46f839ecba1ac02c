"""Backstop: memory allocated around the library (here: the probe run without LD_PRELOAD but
inside the claim's mapping, so the region never sees it while NVML does)."""

from __future__ import annotations

import os
import signal
import subprocess
from types import SimpleNamespace

from kubeletplugin.agent.backstop import Backstop
from kubeletplugin.agent.procmap import Owner
from tests.support import MiB, wait_exec, wait_for
from tests.support.backstop import escape, events


def test_escape_is_reported(node_factory):
    node = node_factory(enforce="report")
    ref, ids = node.claim(memory="256Mi")
    w = escape(node, ids)
    wait_for(lambda: node.claim_metric("gpushare_claim_backstop_violations_total", ref) == 1)
    wait_for(lambda: node.claim_metric("gpushare_claim_memory_nvml_bytes", ref) == 512 * MiB)  # next period
    assert node.claim_metric("gpushare_claim_memory_used_bytes", ref) == 0
    evs = wait_for(lambda: events(node, ref))
    assert len(evs) == 1 and evs[0].type == "Warning" and "above the limit" in evs[0].message
    assert w.running()  # report only: nothing killed
    assert node.claim_metric("gpushare_claim_backstop_kills_total", ref) == 0


def test_within_limit_is_not_reported(node):
    ref, ids = node.claim(memory="1Gi")
    escape(node, ids)  # 512 MiB unhooked, still within the limit
    wait_for(lambda: node.claim_metric("gpushare_claim_memory_nvml_bytes", ref) == 512 * MiB)
    assert node.claim_metric("gpushare_claim_backstop_violations_total", ref) == 0


def test_enforce_kill_is_the_default(node):
    ref, ids = node.claim(memory="256Mi")
    w = escape(node, ids, read=False)
    w.proc.wait(timeout=10)
    assert w.proc.returncode == -9
    # the counters follow the kill: the tenant can be dead (and reaped here) before they move
    # (the node total outlives the claim)
    wait_for(lambda: node.claim_metric("gpushare_claim_backstop_kills_total", ref) == 1
             and node.scrape()["gpushare_backstop_kills_total"][()] == 1)
    evs = wait_for(lambda: events(node, ref))
    assert f"killed pid(s) {w.proc.pid}" in evs[0].message


def test_process_to_claim_mapping(node, tmp_path):
    """Host processes map through GPUSHARE_RUN_DIR's limits inode; a copy of a claim's limits
    file (same text, another inode) maps nowhere."""
    ref, ids = node.claim(memory="1Gi")
    w = node.run("p", ids, "alloc", "--chunk", "64Mi", "--max", "64Mi", "--hold", "30")
    w.read_until("allocated=")
    procs = node.plugin.agent.procs
    wait_for(lambda: (o := procs.owner(w.proc.pid)) is not None and o.uid == ref.uid)
    (tmp_path / "limits").write_bytes(open(node.plugin.driver.files.limits_path(ref.uid), "rb").read())
    forged = subprocess.Popen(["sleep", "30"], env={**os.environ, "GPUSHARE_RUN_DIR": str(tmp_path)})
    try:
        wait_exec(forged, program="sleep")
        assert procs.owner(forged.pid) is None
    finally:
        forged.kill()
        forged.wait()


def test_pod_containers_are_told_apart_by_the_pod_object(node):
    """A pod with two of our claims, one per container: the pod's spec and status give
    container ID -> claim."""
    from kubernetes import client
    a, _ = node.claim(memory="256Mi")
    b, _ = node.claim(memory="256Mi")
    pod = client.CoreV1Api(node.api).create_namespaced_pod(a.namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two"},
        "spec": {"containers": [{"name": "x", "image": "i", "resources": {"claims": [{"name": "ca"}]}},
                                {"name": "y", "image": "i", "resources": {"claims": [{"name": "cb"}]}}],
                 "resourceClaims": [{"name": "ca", "resourceClaimName": a.name},
                                    {"name": "cb", "resourceClaimName": b.name}]}})
    client.CoreV1Api(node.api).patch_namespaced_pod_status("two", a.namespace, {"status": {"containerStatuses": [
        {"name": "x", "containerID": "containerd://" + "a" * 64, "image": "i", "imageID": "", "ready": True,
         "restartCount": 0},
        {"name": "y", "containerID": "cri-o://" + "b" * 64, "image": "i", "imageID": "", "ready": True,
         "restartCount": 0}]}})
    agent = node.plugin.agent
    claims = wait_for(lambda: a.uid in agent.claims and b.uid in agent.claims and dict(agent.claims))
    for c in (claims[a.uid], claims[b.uid]):
        c.pods = {pod.metadata.uid: "two"}
    assert agent._containers_of(pod.metadata.uid, claims) == {"a" * 64: a.uid, "b" * 64: b.uid}
    assert agent._containers_of("no-such-pod", claims) == {}


class _Agent:
    """What Backstop.poll reads of the agent: one claim of 256 MiB on GPU-a, its process 10 held
    (pid -> Owner), and one NVML answer per poll (a GPU left out: its query failed)."""

    def __init__(self, *reads):
        gpu = SimpleNamespace(uuid="GPU-a", memory_limit=256 * MiB)
        self.claims = {"u1": SimpleNamespace(uid="u1", namespace="ns", name="c1", gpus=(gpu,), regions=[None],
                                             pods={})}
        self.claims_generation = 1
        self.procs = SimpleNamespace(owners=self._owners, settle=lambda: self.map_generation, kill=self._kill)
        self.map_generation = 0
        self.mapped = {10}
        self.owner_calls = 0
        self.reads = list(reads)

    def _owners(self, pids):
        self.owner_calls += 1
        return {pid: Owner("u1", None, None) for pid in pids if pid in self.mapped}

    def refresh_if_needed(self):
        pass

    def _kill(self, pid):  # (ProcessMap.kill signals through the pidfd it holds; here by the pid)
        os.kill(pid, signal.SIGKILL)
        return True

    def sampler_process_memory(self, uuids=None):
        assert uuids == {"GPU-a"}  # only the GPUs the claims have
        return self.reads.pop(0)


def test_a_failed_nvml_read_does_not_end_the_episode():
    """A poll whose NVML query failed for the GPU saw nothing, it did not see the claim within its
    limit: the process still over after it is the same episode (one violation, one Event), and
    back within the limit ends it."""
    over, within, unread = {"GPU-a": {10: 512 * MiB}}, {"GPU-a": {}}, {}
    agent = _Agent(over, unread, over, within, over)
    b = Backstop(None, "node", "report", "mock")
    for _ in range(3):
        b.poll(agent)
    assert b.violations == {("u1", 0): 1} and b._events.qsize() == 1
    b.poll(agent)  # within: the episode ends
    b.poll(agent)  # over again: a new one
    assert b.violations == {("u1", 0): 2} and b._events.qsize() == 2


def test_no_claim_no_nvml_query():
    """The backstop asks NVML only for the GPUs its claims have: none, no query. It reads the
    claims again when their generation moves, not at each poll."""
    over = {"GPU-a": {10: 512 * MiB}}
    agent = _Agent(over)
    claims, agent.claims = agent.claims, {}
    b = Backstop(None, "node", "report", "mock")
    b.poll(agent)  # no claim: no query (a query would take the one answer)
    agent.claims = claims
    b.poll(agent)  # the same generation: still the claims it read (none)
    assert agent.reads == [over] and b.violations == {}
    agent.claims_generation += 1
    b.poll(agent)
    assert agent.reads == [] and b.violations == {("u1", 0): 1}


def test_the_owners_are_looked_up_again_when_the_map_or_answer_changes():
    """An answer equal to the last, of processes all mapped, with the map's generation unmoved
    (none exited, no mapping changed): the owners are not looked up again. Any of the three
    moving, or a pid that was not mapped, and they are."""
    a, b_ = {"GPU-a": {10: 512 * MiB}}, {"GPU-a": {10: 100 * MiB}}
    agent = _Agent(a, a, a, b_, b_, {"GPU-a": {10: 100 * MiB, 11: MiB}}, {"GPU-a": {10: 100 * MiB, 11: MiB}})
    b = Backstop(None, "node", "report", "mock")
    calls = []
    for change in (None, None, "map", None, None, None, None):
        if change == "map":
            agent.map_generation += 1  # a process exited, or a claim's mapping changed
        b.poll(agent)
        calls.append(agent.owner_calls)
    # answer a: looked up, skipped, map moved: looked up; b: looked up, skipped; pid 11 unmapped: every time
    assert calls == [1, 1, 2, 3, 3, 4, 5]
    assert b.violations == {("u1", 0): 1}  # one episode: over at a, within at b


def test_a_process_that_comes_while_the_killed_one_still_shows_is_killed_too():
    """Issue 40: a killed process may still show on the GPU for a poll or more (its memory goes as
    it exits). A process of the claim that came in the meantime, over the limit on its own, was
    part of the same episode and never killed: it held its memory as long as the claim stayed
    over. It is killed at the poll that sees it; the one still leaving is not counted twice."""
    first, second = (subprocess.Popen(["sleep", "30"]) for _ in range(2))
    try:
        wait_exec(first, second, program="sleep")
        killed = {"GPU-a": {first.pid: 512 * MiB}}
        both = {"GPU-a": {first.pid: 512 * MiB, second.pid: 512 * MiB}}
        agent = _Agent(killed, both, both)
        agent.mapped = {first.pid, second.pid}
        b = Backstop(None, "node", "kill", "mock")
        b.poll(agent)
        assert first.wait(timeout=10) == -9
        b.poll(agent)  # the killed one still shows, and the newcomer
        assert second.wait(timeout=10) == -9
        b.poll(agent)
        assert b.violations == {("u1", 0): 1} and b.kills == {("u1", 0): 2}
    finally:
        for p in (first, second):
            p.kill()
            p.wait()


def test_the_process_on_the_gpu_is_killed_whatever_its_cgroup_reads_at_the_kill():
    """Issue 40: the kill found a container's processes by reading each one's cgroup; a process
    whose threads keep replacing each other read as no one's (the thread read was gone), so the
    process NVML named was counted as killed and signalled nothing. It is signalled first, by the
    pid the map holds, and its container's cgroup is searched after."""
    tenant = subprocess.Popen(["sleep", "30"])
    try:
        wait_exec(tenant, program="sleep")
        agent = _Agent({"GPU-a": {tenant.pid: 512 * MiB}})
        container = "0::/kubepods/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/gone\n"  # no process reads as in it
        agent.procs.owners = lambda pids: {pid: Owner("u1", None, container) for pid in pids}
        b = Backstop(None, "node", "kill", "mock")
        b.poll(agent)
        assert tenant.wait(timeout=10) == -9
        assert b.kills == {("u1", 0): 1}
    finally:
        tenant.kill()
        tenant.wait()
