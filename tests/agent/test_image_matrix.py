"""The images users run: real distribution roots under podman with the CDI spec the plugin wrote.

Each root comes from Debian's package registry (tests/support/roots.py), and the container gets
nothing of the host's /lib: only the root itself and what the claim's spec mounts (the library,
/etc/ld.so.preload, limits, regions, the simulated driver). In each glibc root (2.31, 2.36,
2.41) the shell starts with the library preloaded and LD_PRELOAD set, and the probe (built to
the glibc 2.17 baseline) is held to the claim: OOM at the limit, the limit in cuMemGetInfo and
NVML, one budget shared by two containers, and its launches paced (test_image_pacing.py: timed,
so it runs alone in `make test`'s serial part). In the musl root (Debian's
musl, as Alpine has it) the library stays out of the way: the program starts and exits 0, says
once on stderr that the claim's library is not active, and the node's backstop kills it when it
holds more than the claim.

Needs root, podman, runc, debootstrap, musl and musl-tools (CI installs them); a cold run builds
the three roots first (about 30 s each here), a warm one reuses them.
"""

from __future__ import annotations

import time
import uuid

import pytest

from playground.containers import PodmanRunner
from tests.support import MiB, roots, wait_for
from tests.support.hook import kv

pytestmark = pytest.mark.podman

LIMIT = 256 * MiB
KILL_BOUND_S = 5.0  # as tests/agent/test_backstop_podman.py: the promise is 200 ms, CI is loaded
INACTIVE = "the claim's library is not active in this program"

WHY_NOT = roots.podman_why_not()
if WHY_NOT:
    pytest.skip(f"image matrix: {WHY_NOT}", allow_module_level=True)


def processes(node, enforcement: str) -> float:
    """gpushare_claim_processes of the node's one claim for this enforcement."""
    samples = node.scrape().get("gpushare_claim_processes", {})
    return sum(v for labels, v in samples.items() if dict(labels)["enforcement"] == enforcement)


@pytest.mark.parametrize("suite", sorted(roots.GLIBC_SUITES))
def test_glibc_image_holds_the_claim(image_claim, suite):
    node, ids = image_claim
    runner = PodmanRunner(rootfs=str(roots.glibc_root(suite)))
    try:
        # the shell starts under the preloaded library, on the root's own glibc
        proc = roots.run_ok(runner, ids, ["/bin/sh", "-c", 'echo "preload=$LD_PRELOAD"; cat /etc/ld.so.preload; '
                                 "ldd --version | head -n 1; " + roots.PROBE + " meminfo"])
        assert f") {roots.GLIBC_SUITES[suite]}\n" in proc.stdout, proc.stdout  # ldd (Debian GLIBC ...) 2.31
        assert "preload=/usr/local/gpushare/lib/libgpushare.so" in proc.stdout
        info = kv(proc.stdout)
        assert int(info["cu_total"]) == LIMIT and int(info["nvml_total"]) == LIMIT, info

        # OOM exactly at the limit
        out = kv(roots.run_ok(runner, ids, [roots.PROBE, "alloc", "--chunk", "64Mi", "--max", "1Gi"]).stdout)
        assert out["result"] == "oom" and int(out["allocated"]) == LIMIT, out

        # one budget across containers: a second container gets what the first left
        holder = runner.start_command(f"hold{uuid.uuid4().hex[:6]}", ids,
                                      [roots.PROBE, "alloc", "--chunk", "192Mi", "--max", "192Mi", "--hold", "30"])
        node.workloads.append(holder)
        assert int(holder.read_until("allocated=", timeout=60)["allocated"]) == 192 * MiB
        # the agent sees which enforcement holds the process: the library took a slot
        wait_for(lambda: processes(node, "library") == 1 and processes(node, "backstop") == 0, timeout=20)
        out = kv(roots.run_ok(runner, ids, [roots.PROBE, "alloc", "--chunk", "32Mi", "--max", "1Gi"]).stdout)
        assert out["result"] == "oom" and int(out["allocated"]) == 64 * MiB, out
        holder.stop()
    finally:
        runner.close()


def test_musl_image_runs_and_the_backstop_holds_its_memory(image_claim):
    node, ids = image_claim
    runner = PodmanRunner(rootfs=str(roots.musl_root()))
    try:
        # starts, exits 0, says once that the library is not active; memory queries unchanged
        proc = roots.run_ok(runner, ids, [roots.PROBE, "meminfo"])
        assert proc.stderr.count(INACTIVE) == 1, proc.stderr
        info = kv(proc.stdout)
        assert int(info["cu_total"]) > LIMIT, info  # the whole simulated GPU: no limit in queries

        # under its limit it runs on, and the agent reports it as held by the backstop alone
        w = runner.start_command(f"musl{uuid.uuid4().hex[:6]}", ids,
                                 [roots.PROBE, "alloc", "--chunk", "64Mi", "--max", "64Mi", "--hold", "30"])
        node.workloads.append(w)
        assert int(w.read_until("allocated=", timeout=60)["allocated"]) == 64 * MiB
        wait_for(lambda: processes(node, "backstop") == 1 and processes(node, "library") == 0, timeout=20)
        assert w.running()
        w.stop()

        # the backstop: more than the claim through the simulated driver, and the container dies
        w = runner.start_command(f"musl{uuid.uuid4().hex[:6]}", ids,
                                 [roots.PROBE, "alloc", "--chunk", "512Mi", "--max", "512Mi", "--hold", "60"])
        node.workloads.append(w)
        assert int(w.read_until("allocated=", timeout=60)["allocated"]) == 512 * MiB
        seen = time.monotonic()
        w.proc.wait(timeout=60)
        took = time.monotonic() - seen
        print(f"backstop (musl image): allocation line -> container gone in {took * 1000:.0f} ms")
        assert w.proc.returncode != 0 and took < KILL_BOUND_S, (w.proc.returncode, took)
    finally:
        runner.close()
