"""`gpushare-dra share-agent` counts each claim's processes on each GPU (the control file's
`procs`) as the kubelet plugin's agent does: the processes NVML lists on the GPU that belong to
the claim, here those that map the claim's region file of that GPU (/proc/<pid>/maps, by device
and inode; kubeletplugin/agent/standalone.py). The library's turns in a claim's slot need
procs > 1, and a forging claim's processes pace at rate / procs (tests/hook/test_forged_timeline.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeletplugin.hooklayout import CONTROL
from tests.support import BUILD, CPU_TIMED, MiB, wait_for
from tests.support.hook import Claim, kv, make_hook, new_claim, share_agent, sim_uuid, throughput

LARGE_US = 2650  # a 4096 fp32 matmul on the H100
SECONDS = 6
BOUND = 3.0  # points


def procs(claim: Claim) -> int:
    return CONTROL["procs"].read((claim.root / "control" / "0").read_bytes())


MAPPER = """
import mmap, os, sys
maps = []
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDWR)
    maps.append(mmap.mmap(fd, 0))
    os.close(fd)
print("mapped", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def mapping(*files: list[Path]) -> Iterator[list[int]]:
    """One process per list, each mapping its files (as the library maps its claim's region) until
    the block ends; their pids."""
    running = [subprocess.Popen([sys.executable, "-c", MAPPER, *map(str, f)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True) for f in files]
    try:
        for p in running:
            assert p.stdout is not None and p.stdout.readline() == "mapped\n"
        yield [p.pid for p in running]
    finally:
        for p in running:
            p.kill()
            p.wait()


class Nvml:
    """NVML's answer: `pids` on the simulated GPU 0; `fail`: the query failed."""

    def __init__(self, pids: list[int]) -> None:
        self.pids, self.fail = pids, False

    def process_memory(self, uuids=None) -> dict[str, dict[int, int]]:
        return {} if self.fail else {sim_uuid(0): dict.fromkeys(self.pids, 0)}


def test_a_claims_processes_are_those_on_the_gpu_that_map_its_region(tmp_path):
    """A hard link of the region maps the same file and counts; a copy does not; a process that
    maps two claims' regions counts in both (more processes only lower a forger's private rate:
    it cannot map its way out of its own claim's count); a process NVML does not list on the GPU
    does not count; a failed NVML query keeps the last count; no NVML, no count (0)."""
    from kubeletplugin.agent.standalone import RunDirClaim, tick

    a, b = (new_claim(tmp_path, BUILD, [{"memory": MiB, "compute": limit}], name) for name, limit in
            (("a", 40), ("b", 60)))
    os.link(a.region(), tmp_path / "link")
    shutil.copy(a.region(), tmp_path / "copy")
    claims = [RunDirClaim(str(c.root)) for c in (a, b)]
    try:
        with mapping([a.region()], [tmp_path / "link"], [b.region()], [tmp_path / "copy"],
                     [a.region(), b.region()]) as pids:
            tick(claims, 0.25)
            assert (procs(a), procs(b)) == (0, 0)
            nvml = Nvml(pids)
            tick(claims, 0.25, nvml=nvml)
            assert (procs(a), procs(b)) == (3, 2)
            nvml.fail = True
            tick(claims, 0.25, nvml=nvml)
            assert (procs(a), procs(b)) == (3, 2)
            nvml.fail, nvml.pids = False, pids[2:4]
            tick(claims, 0.25, nvml=nvml)
            assert (procs(a), procs(b)) == (0, 1)
    finally:
        for c in claims:
            for _, _, region, control in c.gpus:
                region.close()
                control.close()


@pytest.fixture(scope="module")
def build() -> Path:
    make_hook()
    return BUILD


def test_a_claim_of_two_processes_gets_procs_2(build, tmp_path):
    a, b = (new_claim(tmp_path, build, [{"memory": 64 * MiB, "compute": limit}], name) for name, limit in
            (("a", 40), ("b", 60)))
    with share_agent([a, b]):
        argv = ("gpushare-probe", "launch", "--seconds", 4, "--kernel-us", LARGE_US)
        running = [a.popen(*argv), a.popen(*argv), b.popen(*argv)]
        try:
            wait_for(lambda: (procs(a), procs(b)) == (2, 1), timeout=10, what="procs 2 and 1")
        finally:
            for p in running:
                p.communicate(timeout=60)


@CPU_TIMED
def test_a_hard_claim_of_two_processes_holds_its_share_beside_another(build, tmp_path):
    """Hard 40 of two processes beside Hard 60 of one: with procs 2 the two take turns in their
    claim's slot (39.5 / 59.2); without it (no count, before) they read 36 / 57."""
    a, b = (new_claim(tmp_path, build, [{"memory": 64 * MiB, "compute": limit}], name) for name, limit in
            (("a", 40), ("b", 60)))
    with share_agent([a, b]):
        window_at = time.monotonic() + 1.5  # the processes' start and a warm-up: the agent counts them
        argv = ("gpushare-probe", "launch", "--seconds", SECONDS, "--window-at", f"{window_at:.3f}",
                "--kernel-us", LARGE_US, "--mark-every", 1)
        running = [a.popen(*argv), a.popen(*argv), b.popen(*argv)]
        time.sleep(1.5 + SECONDS / 2)
        counted = (procs(a), procs(b))
        outs = [kv(p.communicate(timeout=120)[0]) for p in running]
    work = [throughput(o, LARGE_US) * 100 for o in outs]
    got = (work[0] + work[1], work[2])
    print(f"Hard 40 of two processes beside Hard 60: {got[0]:.1f} / {got[1]:.1f}, procs {counted}",
          [round(w, 1) for w in work])
    assert counted == (2, 1)
    assert abs(got[0] - 40) <= BOUND and abs(got[1] - 60) <= BOUND, (got, outs)
