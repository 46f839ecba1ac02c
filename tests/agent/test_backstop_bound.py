"""The backstop's 200 ms in real podman containers, against the tenants of issue 40.

- Threads that keep replacing each other: the main thread exits (a zombie leader) and every
  thread starts the next one and exits at once (relay_threads.c), so by the time the agent
  reads /proc/<pid>/task/<tid>/cgroup of a thread it saw, that thread is often gone. A lookup
  that failed was not tried again for 1 s (1 GiB in a 256 MiB claim lived 0.03-4.13 s), and the
  kill, which read the process's cgroup the same way, signalled nothing: here it lived 20 s.
- Root in the container renames /var/run/gpushare (the limits file's mount moves with it) and
  puts a limits file of its own at the old name: the library, which runs inside the tenant's
  process, believes it and allows 1 GiB in a 256 MiB claim. Only the backstop holds there.

Each run's hold is timed from the tenant's own clock reading right after its allocation
(CLOCK_MONOTONIC, the host's) to its death (a pidfd opened when the backstop's kill, wrapped
here, begins). Needs root, podman, runc, busybox and a C compiler.
"""

from __future__ import annotations

import os
import select
import shutil
import statistics
import subprocess
import threading
import time
import uuid

import pytest
from kubernetes import client

from playground.containers import PodmanRunner
from tests.support import BUILD, GiB, podman_busybox_why_not, wait_for
from tests.support.tenant import PRIVATE_LOADER, install_private_loader

pytestmark = pytest.mark.podman

if why_not := podman_busybox_why_not():
    pytest.skip(why_not, allow_module_level=True)

TENANT = "/usr/local/bin/relay_threads"
RUNS = 6
PROMISE_S = 0.2
# Each run on a loaded 2-core machine: the old 1 s retry of a failed lookup shows as holds of
# more than this; the median is held to the promise.
RUN_BOUND_S = 0.6


@pytest.fixture(scope="module")
def runner(relay_threads):
    """A busybox root with the tenant program, a private loader and the tools of the rename."""
    r = PodmanRunner(os.path.join(BUILD, "gpushare-probe"), libraries=(relay_threads,))
    shutil.copy(relay_threads, os.path.join(r.rootfs, TENANT.lstrip("/")))
    compiler = shutil.which("cc") or "gcc"
    libgcc = subprocess.run([compiler, "-print-file-name=libgcc_s.so.1"], capture_output=True, text=True).stdout.strip()
    real = os.path.realpath(libgcc)  # pthread_exit loads it to unwind the thread
    target = os.path.join(r.rootfs, real.lstrip("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copy(real, target)
    for tool in ("mv", "mkdir", "ln"):
        os.symlink("busybox", os.path.join(r.rootfs, "bin", tool))
    install_private_loader(r.rootfs)
    yield r
    r.close()


@pytest.fixture
def podman_node(node_factory):
    node = node_factory(cdi_root=PodmanRunner.CDI_ROOT)
    refs = []
    yield node, refs
    for ref in refs:
        node.kubelet.unprepare(ref)


def kill_times(backstop) -> list[tuple[float, float, float]]:
    """time.monotonic() of each kill the backstop makes from now on: when it starts, when the
    processes it was called for are dead (their pidfds readable), when it returns."""
    times: list[tuple[float, float, float]] = []
    real = backstop._kill

    def timed(claim, i, limit, process_memory, owners):
        start = time.monotonic()
        fds = [os.pidfd_open(pid) for pid in process_memory]
        dead: list[float] = []

        def watch():
            for fd in fds:
                select.select([fd], [], [], 10)  # (a pidfd is readable once its process is dead)
            dead.append(time.monotonic())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            return real(claim, i, limit, process_memory, owners)
        finally:
            end = time.monotonic()
            watcher.join(timeout=11)
            for fd in fds:
                os.close(fd)
            times.append((start, dead[0] if dead else float("inf"), end))

    backstop._kill = timed
    return times


def held(node, runner, ids, command: str) -> tuple[float, float]:
    """Run `command` (a shell line ending in the tenant) in a container; seconds from the
    tenant's allocation to the backstop's kill, and to the tenant's death."""
    kills = kill_times(node.plugin.agent.backstop)
    try:
        w = runner.start_command(f"bound{uuid.uuid4().hex[:6]}", ids, ["/bin/sh", "-c", command])
        node.workloads.append(w)
        line = w.read_until("allocated=", timeout=120)
        assert line["allocated"] == str(GiB), line
        at = int(line["at_ns"]) / 1e9
        lines = w.wait(timeout=60)
        gone = time.monotonic()
        assert "survived" not in lines, lines
        assert kills, "the backstop killed nothing"
        start, dead, end = kills[0]
        print(f"allocation -> kill {(start - at) * 1000:.0f} ms, -> dead {(dead - at) * 1000:.0f} ms; the kill "
              f"(its container's cgroup) took {(end - start) * 1000:.0f} ms; podman's end {(gone - at) * 1000:.0f} ms")
        return start - at, dead - at
    finally:
        del node.plugin.agent.backstop._kill  # the class's method again


def report(what: str, runs: list[tuple[float, float]]) -> None:
    """Each run's hold: from the allocation to the tenant's death."""
    holds = [dead for _, dead in runs]
    print(f"{what}: 1 GiB in a 256 MiB claim held {', '.join(f'{h * 1000:.0f}' for h in holds)} ms until "
          f"its death (median {statistics.median(holds) * 1000:.0f}, max {max(holds) * 1000:.0f}; promise "
          f"{PROMISE_S * 1000:.0f}); the kill began after {', '.join(f'{k * 1000:.0f}' for k, _ in runs)} ms")
    assert statistics.median(holds) <= PROMISE_S, holds
    assert max(holds) <= RUN_BOUND_S, holds


def test_threads_that_keep_replacing_each_other_are_killed_within_the_bound(podman_node, runner):
    node, refs = podman_node
    ref, ids = node.claim(memory="256Mi")
    refs.append(ref)
    holds = [held(node, runner, ids, f"exec /bin/env -u LD_PRELOAD {PRIVATE_LOADER} {TENANT} {GiB} 20")
             for _ in range(RUNS)]
    report("threads replacing each other", holds)


# Root in the container: the claim's folder moves aside (its mounts with it), a folder of the
# tenant's own takes its name, with the claim's limits but 4 GiB of memory.
RENAME = ("mv /var/run/gpushare /var/run/moved && mkdir /var/run/gpushare && "
          "grep -v MEMORY_LIMIT /var/run/moved/limits > /var/run/gpushare/limits && "
          "echo GPUSHARE_MEMORY_LIMIT_0=4294967296 >> /var/run/gpushare/limits && "
          "ln -s /var/run/moved/region /var/run/gpushare/region && "
          "ln -s /var/run/moved/sim.state /var/run/gpushare/sim.state && ")


def test_root_renaming_the_claims_folder_is_killed_within_the_bound(podman_node, runner):
    node, refs = podman_node
    ref, ids = node.claim(memory="256Mi")
    refs.append(ref)
    holds = []
    for _ in range(RUNS):
        try:
            holds.append(held(node, runner, ids, RENAME + f"exec {TENANT} {GiB} 20 plain"))
        finally:  # the root filesystem is the runner's own folder: the next container gets it back as it was
            run = os.path.join(runner.rootfs, "var", "run")
            if os.path.isdir(os.path.join(run, "moved")):
                shutil.rmtree(os.path.join(run, "gpushare"))
                os.rename(os.path.join(run, "moved"), os.path.join(run, "gpushare"))
    report("root renaming the claim's folder", holds)
    # the attack on the library worked: it let the 1 GiB through and accounted it in the region
    evs = wait_for(lambda: [e for e in client.CoreV1Api(node.api).list_namespaced_event(ref.namespace).items
                            if e.involved_object.uid == ref.uid and e.reason == "GpuMemoryLimitExceeded"])
    assert f"the library accounted {GiB}" in evs[0].message, evs[0].message
