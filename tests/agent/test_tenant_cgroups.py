"""The backstop against tenants that play with their process or their cgroups (issue 26).

- Attack 2: a process whose main thread has exited (pthread_exit) while another thread allocates
  around the library. Its main thread is a zombie: /proc/<pid>/cgroup reads `/` in every cgroup
  v1 hierarchy and its mount table and environment are gone, so the agent read nothing of it and
  the process held 4x its claim for as long as it liked. The agent reads a live thread's facts.
  Tested in a pod cgroup of this host's v1 hierarchy (pids) and of a cgroup2 hierarchy the test
  mounts itself.
- Attack 3: a tenant that may make sub-cgroups of its container (delegation, a privileged pod)
  moves into one named `pod<uid of a victim pod>`. The deepest pod<uid> in the path won, so the
  tenant's memory counted against the victim's claim and the backstop killed the victim. Only
  the kubelet's layout counts now (the pod right under kubepods): the victim lives, the tenant
  is held to its own claim.

Host processes given the claims' CDI edits (ProcessRunner), in cgroups laid out as the kubelet
lays out a pod's (`kubepods/pod<uid>/<container>`), the claims reserved for those pods. Root only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest
from kubernetes import client

from playground.claims import make_claim, result
from playground.containers import _cgroup_mounts, cgroup_mount
from tests.support import GiB, MiB, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (cgroups)")

# Under a loaded 2-core CI machine; the promise is 200 ms (the measured figure is printed).
KILL_BOUND_S = 5.0
RELAY_RUNS = 3
RELAY_BOUND_S = 0.9  # below the 1 s a failed lookup used to wait before the next


def prepare(node, memory: str, pod: str):
    """A claim of `memory` reserved for the pod `pod` (UID), as the scheduler does before Prepare."""
    ref = make_claim(node.api, [result("gpu-0", consumed={"memory": memory, "compute": "50"})])
    client.ResourceV1Api(node.api).patch_namespaced_resource_claim_status(
        ref.name, ref.namespace,
        {"status": {"reservedFor": [{"resource": "pods", "name": f"p-{pod[:8]}", "uid": pod}]}})
    answer = node.kubelet.prepare(ref).claims[ref.uid]
    assert not answer.error, answer.error
    return ref, [i for d in answer.devices for i in d.cdi_device_ids]


def in_cgroup(folder: str, command: str) -> list[str]:
    """A shell that moves itself into `folder` (a cgroup) and then runs `command`."""
    return ["/bin/sh", "-c", f'echo $$ > "$0/cgroup.procs" && {command}', folder]


def around_the_library(probe: str, *args: str) -> str:
    return "exec /usr/bin/env -u LD_PRELOAD " + " ".join([probe, *args])


def claim_metric(node, name, ref) -> float:
    return node.claim_metric(name, ref) or 0.0


@pytest.fixture
def cleanup():
    folders: list[str] = []
    yield folders
    for folder in reversed(folders):  # deepest last in, first out
        try:  # the workloads still in it (this runs before the node's teardown stops them)
            with open(os.path.join(folder, "cgroup.procs")) as f:
                for pid in f.read().split():
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        deadline = time.monotonic() + 5
        while os.path.isdir(folder):
            try:
                os.rmdir(folder)
            except OSError:  # its killed processes are still leaving
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)


def make_cgroup(mount: str, relative: str, cleanup: list[str]) -> str:
    path = os.path.join(mount, relative)
    parts = relative.split("/")
    for i in range(len(parts)):
        folder = os.path.join(mount, *parts[:i + 1])
        if not os.path.isdir(folder):
            os.mkdir(folder)
            cleanup.append(folder)
    return path


@pytest.fixture(params=["v1", "v2", "v2-pidns"])
def hierarchy(request, tmp_path):
    """The mount point of a cgroup hierarchy: this host's v1 `pids` one, or cgroup2 mounted here
    (v2-pidns: the process also in a pid namespace of its own, as in a container: NVML answers
    its host pid, the agent reads the kernel's facts of a live thread)."""
    if request.param == "v1":
        mount = next((m for t, options, m in _cgroup_mounts() if t == "cgroup" and "pids" in options), None)
        if mount is None:
            pytest.skip("no cgroup v1 pids hierarchy on this host")
        yield mount
        return
    mount = str(tmp_path / "cgroup2")
    os.mkdir(mount)
    done = subprocess.run(["mount", "-t", "cgroup2", "none", mount], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount cgroup2: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", mount], check=False)


def test_a_process_whose_main_thread_exited_is_killed(node, hierarchy, cleanup, request):
    """The probe's main thread calls pthread_exit; a second thread allocates 512 MiB around the
    library in a 256 MiB claim. The backstop must see it (from the live thread) and kill it."""
    pod = str(uuid.uuid4())
    ref, ids = prepare(node, "256Mi", pod)
    folder = make_cgroup(hierarchy, f"kubepods/pod{pod}/leader-exits", cleanup)
    pidns = request.node.callspec.params["hierarchy"].endswith("pidns")
    probe = f"/usr/bin/unshare --pid --fork {node.runner.probe}" if pidns else node.runner.probe
    w = node.runner.start_command("leader", ids, in_cgroup(folder, around_the_library(
        probe, "--main-exits", "alloc", "--chunk", "512Mi", "--max", "512Mi", "--hold", "30")))
    node.workloads.append(w)
    line = w.read_until("allocated=", timeout=30)
    seen = time.monotonic()
    assert line["allocated"] == str(512 * MiB), line
    w.proc.wait(timeout=20)  # (it holds for 30 s unless killed)
    took = time.monotonic() - seen
    print(f"backstop ({os.path.basename(hierarchy)}): exited-leader process killed {took * 1000:.0f} ms "
          "after its allocation line")
    assert w.proc.returncode != 0 if pidns else w.proc.returncode == -9, w.proc.returncode  # (unshare says 1)
    assert took < KILL_BOUND_S, took
    assert "main_exits=" in " ".join(w.lines)  # it did run with its main thread gone
    wait_for(lambda: claim_metric(node, "gpushare_claim_backstop_kills_total", ref) >= 1)


def test_a_process_whose_threads_keep_replacing_each_other_is_killed_within_the_bound(
        node, hierarchy, cleanup, request, relay_threads):
    """Issue 40: the main thread exits and every thread starts the next and exits at once
    (relay_threads.c), 1 GiB in a 256 MiB claim. A lookup raced by the threads failed, and a
    failed one was not tried again for 1 s; a kill found the process by its cgroup, read from a
    thread that was gone by then, and signalled nothing: the tenant held the memory 20 s. Each
    run is timed from the tenant's clock reading right after its allocation to its end."""
    pod = str(uuid.uuid4())
    ref, ids = prepare(node, "256Mi", pod)
    pidns = request.node.callspec.params["hierarchy"].endswith("pidns")
    tenant = f"/usr/bin/unshare --pid --fork {relay_threads}" if pidns else relay_threads
    holds = []
    for run in range(RELAY_RUNS):  # a cgroup each: an empty v1 cgroup may go (a host's release agent)
        folder = make_cgroup(hierarchy, f"kubepods/pod{pod}/relay{run}", cleanup)
        w = node.runner.start_command(f"relay{run}", ids, in_cgroup(folder, around_the_library(tenant, str(GiB), "20")))
        node.workloads.append(w)
        at = int(w.read_until("allocated=", timeout=30)["at_ns"]) / 1e9
        w.proc.wait(timeout=30)  # (it holds for 20 s unless killed)
        holds.append(time.monotonic() - at)
        assert "survived" not in w.wait(), w.lines
    print(f"backstop ({os.path.basename(hierarchy)}): threads replacing each other held 1 GiB in a 256 MiB claim "
          f"{', '.join(f'{h * 1000:.0f}' for h in holds)} ms")
    assert max(holds) < RELAY_BOUND_S, holds
    wait_for(lambda: claim_metric(node, "gpushare_claim_backstop_kills_total", ref) >= RELAY_RUNS)


def test_a_sub_cgroup_named_after_another_pod_gets_nobody_else_killed(node, cleanup):
    """The victim holds 448 MiB of its 512 MiB claim, honestly. The tenant (256 MiB claim) moves
    into a sub-cgroup of its container named pod<victim's UID> and allocates 192 MiB around the
    library: within its own claim, so nobody is killed (before: 448 + 192 counted against the
    victim's claim and the victim was killed). A second tenant process there allocating 128 MiB
    more takes the tenant's claim past its limit: a tenant process is killed, the victim lives."""
    mount = cgroup_mount()
    if mount is None:
        pytest.skip("no cgroup hierarchy to make pod cgroups in")
    victim_pod, tenant_pod = str(uuid.uuid4()), str(uuid.uuid4())
    victim_ref, victim_ids = prepare(node, "512Mi", victim_pod)
    tenant_ref, tenant_ids = prepare(node, "256Mi", tenant_pod)
    probe = node.runner.probe
    victim_cg = make_cgroup(mount, f"kubepods/pod{victim_pod}/victim", cleanup)
    tenant_cg = make_cgroup(mount, f"kubepods/pod{tenant_pod}/tenant", cleanup)
    forged = os.path.join(tenant_cg, f"pod{victim_pod}")
    cleanup.append(forged)  # made by the tenant itself, removed first

    victim = node.runner.start_command("victim", victim_ids, in_cgroup(victim_cg, "exec " + " ".join(
        [probe, "alloc", "--chunk", "448Mi", "--max", "448Mi", "--hold", "60"])))
    node.workloads.append(victim)
    assert victim.read_until("allocated=", timeout=30)["allocated"] == str(448 * MiB)
    # the tenant's container process makes its own sub-cgroup (as delegation allows) and moves there
    tenant = node.runner.start_command("tenant", tenant_ids, in_cgroup(
        tenant_cg, f'mkdir -p "$0/pod{victim_pod}" && echo $$ > "$0/pod{victim_pod}/cgroup.procs" && ' +
        around_the_library(probe, "alloc", "--chunk", "192Mi", "--max", "192Mi", "--hold", "60")))
    node.workloads.append(tenant)
    assert tenant.read_until("allocated=", timeout=30)["allocated"] == str(192 * MiB)
    with open(f"/proc/{tenant.proc.pid}/cgroup") as f:
        assert f"/pod{tenant_pod}/tenant/pod{victim_pod}" in f.read()  # the attack is in place
    procs = node.plugin.agent.procs
    owner = wait_for(lambda: procs.owner(tenant.proc.pid), what="the tenant mapped")
    assert owner.uid == tenant_ref.uid and owner.pod == tenant_pod
    time.sleep(1.5)  # 30 backstop polls, 3 agent periods
    assert victim.running() and tenant.running()
    assert claim_metric(node, "gpushare_claim_backstop_violations_total", victim_ref) == 0

    more = node.runner.start_command("tenant2", tenant_ids, in_cgroup(forged, around_the_library(
        probe, "alloc", "--chunk", "128Mi", "--max", "128Mi", "--hold", "60")))
    node.workloads.append(more)
    tenant.proc.wait(timeout=20)  # the larger of the tenant's two: killed first, then the rest fits
    assert tenant.proc.returncode == -9
    wait_for(lambda: claim_metric(node, "gpushare_claim_backstop_kills_total", tenant_ref) >= 1)
    assert victim.running()
    assert claim_metric(node, "gpushare_claim_backstop_violations_total", victim_ref) == 0
    assert claim_metric(node, "gpushare_claim_backstop_kills_total", victim_ref) == 0
