"""Compute shares of framework-shaped work (issue 39) on the simulated GPU, under the library and
`gpushare-dra share-agent` as in a cluster: `gpushare-probe replay` of the traces in hook/traces
(a transformer training step of an eager framework, a Python elementwise loop, a batch-1 MLP
server). Each case is a row the H100 failed on 2026-11-28 (docs/compute.md, "Framework-shaped
work"); what each read on the simulator with the library before (main 7424df1) is in its test.
Windows are a few seconds, so each figure moves a few points with the load of the machine."""

from __future__ import annotations

import mmap
import threading
import time
from pathlib import Path

import pytest

from kubeletplugin.hooklayout import HEADER_SIZE, REGION_HEADER, REGION_MAGIC
from playground.simcpu import cpus_awake, measured_first
from tests.support import BUILD, CPU_TIMED, REPO, MiB, wait_for
from tests.support.hook import Claim, kv, make_hook, new_claim, share_agent, throughput

TRACES = REPO / "hook" / "traces"
LARGE_US = 2650  # a 4096 fp32 matmul on the H100
PLAIN = {"LD_PRELOAD": ""}  # the same process without the library: plain time slicing


@pytest.fixture(scope="module")
def build() -> Path:
    make_hook()
    return BUILD


def claims(tmp_path: Path, build: Path, *limits: int) -> list[Claim]:
    return [new_claim(tmp_path, build, [{"memory": 64 * MiB, "compute": limit}], f"c{i}")
            for i, limit in enumerate(limits)]


def replay(claim: Claim, trace: str, seconds: float, *extra, env=None):
    return claim.popen("gpushare-probe", "replay", "--trace", TRACES / f"{trace}.trace", "--seconds", seconds,
                       *extra, env=env)


def done(p) -> dict:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, (out, err)
    return kv(out)


def window_at(after: float = 1.5) -> float:
    """One window for every process of a case, after a warm-up (a claim's first slot period, its
    costs not known yet)"""
    return time.clock_gettime(time.CLOCK_MONOTONIC) + after


def training_pair(tmp_path: Path, build: Path, trace: str) -> tuple[list[float], list[float], float]:
    """Two processes replaying the training trace, plain (no library) then as Hard 30 / Hard 70 under
    the library and the share agent: each one's steps as % of the trace alone, and how busy the trace
    keeps the GPU alone (%)"""
    a, b = claims(tmp_path, build, 30, 70)
    alone = done(replay(a, trace, 4, env=PLAIN))
    solo, busy = float(alone["steps"]) / 4, float(alone["gpu_share"])
    at = window_at()
    plain = [float(done(p)["steps"]) / 5 / solo * 100
             for p in [replay(c, trace, 5, "--window-at", at, env=PLAIN) for c in (a, b)]]
    with share_agent([a, b]):
        at = window_at()
        paced = [float(done(p)["steps"]) / 5 / solo * 100
                 for p in [replay(c, trace, 5, "--window-at", at) for c in (a, b)]]
    print(f"{trace} pair: solo {solo:.1f} steps/s, plain {plain[0]:.1f} / {plain[1]:.1f}, library 30/70 "
          f"{paced[0]:.1f} / {paced[1]:.1f} % of solo, together {100 * sum(paced) / sum(plain):.1f} % of plain "
          f"(alone {busy:.1f} % busy)")
    return plain, paced, busy


@CPU_TIMED
def test_a_training_pair_gets_its_shares_and_what_time_slicing_would_give_it(build, tmp_path):
    """Two eager training jobs (the trace keeps the GPU about two thirds busy alone: its forward is
    CPU-bound, each step ends in a sync and host work) as Hard 30 / Hard 70: each at least its
    share of what it does alone (less 3 points), and together at least 90 % of what the same two
    do with no library. The H100: 23.2 / 48.4 % of solo, together 71.5 % where plain time slicing
    gave 55 + 55. The library before read 24.0-35.5 / 68.8-76.9 here, together 82-86 % of plain
    (4 runs): each claim's slot was its own, idle between its steps, and the other waited for its
    own slot. Since: 44-45 / 72-73, 93-96 % of plain (the relay's fill of each other's idle time)."""
    plain, paced, _ = training_pair(tmp_path, build, "train-transformer")
    assert paced[0] >= 27 and paced[1] >= 67, (paced, plain)
    assert sum(paced) >= 0.9 * sum(plain), (paced, plain)


@CPU_TIMED
@pytest.mark.xfail(strict=True, reason="the H200 (2026-11-28, fda415e): 31.2 / 75.5 % of solo under Hard 30/70, "
                   "together 106.7 % where plain time slicing gave 156.7 (its target as Hard 30 allows: 127); "
                   "here 39.6-40.4 / 80.7-81.4, together 120-122 % against 178-181 (target 150-152): outside its "
                   "slot a claim fills only gaps of 2 ms in its neighbour's work, and this step has none "
                   "(docs/compute.md, 'The H200's training pair')")
def test_the_h200s_training_pair_keeps_what_time_slicing_gives_it(build, tmp_path):
    """The H200's capture of the same kind of job (hook/traces/train-transformer-h200.trace: 681 GPU
    ops, 42 % busy alone, the GPU idle in 425 gaps a step, none of 1 ms) as Hard 30 / Hard 70: each
    at least its share of solo less 3 points, and together at least 0.95x what plain time slicing
    gives the pair (gpu-validate section 8's target), each claim's part of it at most what its limit
    allows: Hard 30 of a step 42 % busy is 71 % of solo, less than plain time slicing's 89 here, so
    0.95x plain (171 %) would need the 70 claim faster than alone. The H200 on 2026-11-28 (fda415e):
    31.2 / 75.5 % of solo, together 106.7 % where plain time slicing gave 77.4 + 79.3 = 156.7 % (the
    job alone 56 % busy: Hard 30 allows 54 % of solo; the target so 127 %). Its host work is
    most of each step (a busy CPU loop, 85 % of a core per process): the two processes are put ahead
    of the machine's other work (`measured_first`), as on the H200's 16 cores, else what the 2 cores
    here leave them moved the plain pair between 114 and 180 % of solo."""
    with measured_first():
        plain, paced, busy = training_pair(tmp_path, build, "train-transformer-h200")
    allowed = [min(p, 100 * limit / busy) for p, limit in zip(plain, (30, 70), strict=True)]
    assert paced[0] >= 27 and paced[1] >= 67, (paced, plain)
    assert sum(paced) >= 0.95 * sum(allowed), (paced, plain, allowed)


@CPU_TIMED
def test_a_matmul_claim_beside_an_elementwise_loop_gets_its_share(build, tmp_path):
    """A Hard 30 claim of 2.65 ms kernels beside the elementwise loop at Hard 70 (6 us kernels, each
    after 6 us of the CPU: the loop is launch-bound, about 60 % of the GPU alone, and under its
    share all the time). The matmul claim should do 30 +- 3 % of what it does alone. The H100 read
    18.6, the library before 15.5-16.9 here: the loop launched into the matmul claim's slot (a
    context switch each way at each slice end). Now a claim that uses most of its own slot does
    not launch into its neighbour's work: 27.9-28.2."""
    mm, loop = claims(tmp_path, build, 30, 70)
    solo = throughput(done(mm.popen("gpushare-probe", "launch", "--seconds", 3, "--kernel-us", LARGE_US,
                                    env=PLAIN)), LARGE_US)
    with share_agent([mm, loop]):
        at = window_at()
        pm = mm.popen("gpushare-probe", "launch", "--seconds", 5, "--kernel-us", LARGE_US, "--window-at", at)
        pl = replay(loop, "elementwise", 5, "--window-at", at)
        got = throughput(done(pm), LARGE_US) / solo * 100
        loop_gpu = float(done(pl)["gpu_share"])
    print(f"matmul Hard 30 beside the elementwise loop at 70: {got:.1f} % of solo; the loop {loop_gpu:.1f} % "
          "of the GPU")
    assert abs(got - 30) <= 3, got


@CPU_TIMED
@cpus_awake()  # a real driver spins in its synchronize: the client's CPU never halts
def test_a_batch1_server_beside_a_busy_claim_waits_no_longer_than_under_time_slicing(build, tmp_path):
    """The batch-1 MLP server at 50 (18 small kernels a request, 2.4 ms between requests) beside a
    busy claim of 2.65 ms kernels at 50: its p50 at most 1.2x alone, its p99 no worse than plain
    time slicing gives it (10 % over: a p99 of 1,500 requests moves so much). The H100 read p99
    15.0 ms under the library, 2.9 under plain time slicing; the simulator with the library before
    read 0.36 / 2.8 ms against plain 2.7 / 2.8: the H100's p99 is not reproduced here. With the
    fill, one kernel of margin let the busy claim fill the server's pauses and its p50 rose to 0.62 ms
    (relay.py, CATCHUP_MARGIN_KERNELS)."""
    client, busy = claims(tmp_path, build, 50, 50)
    with share_agent([client, busy]):
        res = {"solo": done(replay(client, "serve-mlp", 4, env=PLAIN))}
        for name, env in (("plain", PLAIN), ("library", None)):
            b = busy.popen("gpushare-probe", "launch", "--seconds", 5.5, "--kernel-us", LARGE_US, env=env)
            time.sleep(0.5)
            res[name] = done(replay(client, "serve-mlp", 4, env=env))
            done(b)
    p50 = {k: float(v["step_p50_ms"]) for k, v in res.items()}
    p99 = {k: float(v["step_p99_ms"]) for k, v in res.items()}
    print(f"batch-1 server p50 / p99 ms: solo {p50['solo']:.3f} / {p99['solo']:.3f}, plain {p50['plain']:.3f} / "
          f"{p99['plain']:.3f}, library {p50['library']:.3f} / {p99['library']:.3f}")
    assert p50["library"] <= 1.2 * p50["solo"], res
    assert p99["library"] <= 1.1 * p99["plain"], res


@CPU_TIMED
def test_a_neighbour_forging_work_cannot_hold_a_claim_below_its_share(build, tmp_path):
    """A tenant whose claim (Hard 70) launches nothing but keeps its region's charged GPU time
    moving and its queue's end ahead (the relay then tells its neighbour it has work, always): the
    neighbour, a training job at Hard 30, fills none of the forger's slot, and still gets its own:
    at least 30 % of what it does alone, less 3 points (docs/security.md). Beside an idle honest
    neighbour it fills that slot up to its share of the GPU, about 44 % of its solo."""
    honest, forger = claims(tmp_path, build, 30, 70)
    solo = float(done(replay(honest, "train-transformer", 4, env=PLAIN))["steps"]) / 4
    stop = threading.Event()

    def forge() -> None:
        with open(forger.region(), "r+b") as f, mmap.mmap(f.fileno(), HEADER_SIZE) as m:
            while not stop.is_set():
                now = time.monotonic_ns()
                REGION_HEADER["pace_gpu_ns"].write(m, now)
                REGION_HEADER["pace_qend_ns"].write(m, now + 10_000_000)  # its queue said to end 10 ms on
                stop.wait(0.001)

    t = threading.Thread(target=forge)
    # the tenant's process: the library in it lays out the claim's region (the agent reads no region
    # before), then the tenant writes it
    tenant = forger.popen("gpushare-probe", "alloc", "--chunk", MiB, "--max", MiB, "--hold", 20)
    try:
        wait_for(lambda: REGION_HEADER["magic"].read(forger.region().read_bytes()[:HEADER_SIZE]) == REGION_MAGIC,
                 timeout=10, what="the tenant's region laid out")
        with share_agent([honest, forger]):
            t.start()
            try:
                steps = float(done(replay(honest, "train-transformer", 5, "--warmup", 1.5))["steps"])
            finally:
                stop.set()
                t.join()
    finally:
        tenant.kill()
        tenant.communicate()
    got = steps / 5 / solo * 100
    print(f"training Hard 30 beside a forger at 70: {got:.1f} % of solo")
    assert got >= 27, got
