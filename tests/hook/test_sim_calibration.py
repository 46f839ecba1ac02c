"""The simulated GPU (hook/sim) against the H100 it models (docs/compute.md, "The simulated GPU"),
each figure within 10 % and never kinder than the H100 by more than that. Sources: the H100
measurements of 2026-11-22 (event-pair times, the inference client's latency), the probe's
launch rate on the H100 of 2026-11-24 (docs/validation.md), and issue 29 for the figure those
notes do not hold (two busy contexts together: 89.6 % of solo). No library here: the simulated
driver alone, as the H100 ran without it."""
from __future__ import annotations

from pathlib import Path

import pytest

from kubeletplugin.hooklayout import SIM_MPS_FILE, SIM_MPS_PIPE_ENV, sim_mps_server_text
from playground.simcpu import cpus_awake, measured_first
from tests.support import CPU_TIMED
from tests.support.hook import kv, throughput

LARGE_US = 2650  # one 4096 fp32 matmul on the H100, alone
MPS_US = 500  # MPS throughput does not depend on the kernel's length here: shorter, for more kernels in 2 s


def within(got: float, h100: float) -> bool:
    return abs(got - h100) <= 0.10 * h100


def busy_neighbour(claim, seconds: float):
    return claim.popen("gpushare-probe", "launch", "--seconds", seconds, "--kernel-us", LARGE_US,
                       env={"LD_PRELOAD": ""})


def test_two_busy_contexts_together_lose_the_context_switches(make_claim):
    """Issue 29: two large-kernel contexts time-sliced on the H100 did 89.6 % of solo together."""
    claim = make_claim()
    procs = [busy_neighbour(claim, 1.5) for _ in range(2)]
    outs = [kv(p.communicate(timeout=60)[0]) for p in procs]
    together = sum(throughput(o, LARGE_US) for o in outs)
    assert within(together, 0.896), outs


def test_a_kernel_beside_a_busy_context_waits_one_or_two_slices(make_claim):
    """The H100: one matmul's event pair read 2.65 ms alone, 5.16 ms beside a busy matmul process
    (median), p90 7.7 ms (2.9x alone: a preempted kernel sometimes waits two slices)."""
    claim = make_claim()
    alone = kv(claim.run("gpushare-probe", "time", "--count", 10, "--kernel-us", LARGE_US, preload=False).stdout)
    n = busy_neighbour(claim, 4)
    try:
        beside = kv(claim.run("gpushare-probe", "time", "--count", 100, "--kernel-us", LARGE_US,
                              preload=False).stdout)
    finally:
        n.kill()
        n.communicate()
    assert within(float(alone["median_ms"]), 2.65), alone
    assert within(float(beside["median_ms"]), 5.16) and within(float(beside["p90_ms"]), 7.7), beside


@CPU_TIMED
def test_a_client_beside_a_busy_context_waits_for_its_slice_end(make_claim):
    """The H100: an inference-like client (0.41 ms requests, 2.4 ms apart) beside a busy matmul
    process, no library: p99 2.91 ms (2.31x its solo p99 of 1.26 ms, which is the Python
    client's CPU jitter; the simulator's solo p99 is about 0.6 ms, so the absolute figure is the
    one compared). A request that comes while the neighbour runs waits for the slice end. The
    CPUs kept awake, as the H100's driver kept its CPU awake spinning (playground/simcpu.py): else this
    machine's wake-ups, not the model, make the p99 (a CI run read 3.6-3.9 ms in every try).
    The machine's other work only adds to a p99 (a loaded 2-core machine read 5.09 ms once): the
    client and neighbour run ahead of it (measured_first), and the measurement is the best of up
    to six 3 s runs, ended at the first within the bound (a model too kind or too harsh misses in
    all six)."""
    claim = make_claim()
    outs: list[dict] = []
    with cpus_awake(), measured_first():
        n = busy_neighbour(claim, 25)
        try:
            while len(outs) < 6 and not (outs and within(min(float(o["p99_ms"]) for o in outs), 2.91)):
                outs.append(kv(claim.run("gpushare-probe", "serve", "--seconds", 3, preload=False).stdout))
        finally:
            n.kill()
            n.communicate()
    assert within(min(float(o["p99_ms"]) for o in outs), 2.91), outs


@CPU_TIMED
def test_a_launch_costs_the_cpu_what_it_cost_on_the_h100(make_claim):
    """The probe launched 1 us kernels at 249,023-264,812 a second on the H100 (2026-11-24, without
    the library): about 3.2 us of driver time per launch besides the loop's own. The loop's own
    time is this machine's (286k/s here when quiet, 240k/s under load), so the driver's time is
    measured as the difference from launches that cost nothing (GPUSHARE_SIM_LAUNCH_NS=0), the
    best of five runs each: another process on the CPU only slows a run (with three, a CI run of
    2026-11-26 needed two reruns)."""
    claim = make_claim()

    def per_launch_us(env: dict, kernel_us: float = 1) -> tuple[float, list[dict]]:
        outs = [kv(claim.run("gpushare-probe", "launch", "--seconds", 0.3, "--kernel-us", kernel_us, preload=False,
                             env=env).stdout) for _ in range(5)]
        return 1e6 / max(float(o["launches_per_s"]) for o in outs), outs

    with measured_first():
        with_driver, outs = per_launch_us({})
        loop_only, bare = per_launch_us({"GPUSHARE_SIM_LAUNCH_NS": "0"}, kernel_us=0.05)  # GPU-bound at 1 us
    assert within(with_driver - loop_only, 3.2), (with_driver, loop_only, outs, bare)


def mps_client(tmp_path: Path, name: str, percentage: int) -> dict:
    """The environment of a client of one simulated MPS server at `percentage` (no library)"""
    d = tmp_path / f"mps-{name}"
    d.mkdir()
    (d / SIM_MPS_FILE).write_text(sim_mps_server_text("gpu0", percentage))
    return {SIM_MPS_PIPE_ENV: str(d), "LD_PRELOAD": ""}


def mps_launch(claim, *envs: dict) -> list[float]:
    """Each client's work (a whole-GPU grid of kernels, 2 s together), of the GPU's solo speed"""
    with measured_first():  # the launchers ahead of the machine's other work: a stalled launcher idles its SMs
        procs = [claim.popen("gpushare-probe", "launch", "--seconds", 2, "--kernel-us", MPS_US, "--grid", 132,
                             env=env) for env in envs]
        return [throughput(kv(p.communicate(timeout=60)[0]), MPS_US) for p in procs]


@CPU_TIMED
def test_an_mps_client_alone_is_held_below_its_share_of_the_sms(make_claim, tmp_path):
    """Issue 29: on the H100 an MPS client at 30 % of the SMs, alone, ran 4096 matmuls (a grid
    over every SM) at 24.6 % of solo, not 30 %."""
    [alone] = mps_launch(make_claim(), mps_client(tmp_path, "a", 30))
    print(f"MPS client at 30 % alone: {100 * alone:.1f} % of solo")
    assert within(alone, 0.246), alone


@CPU_TIMED
def test_an_mps_pair_splits_by_share_and_loses_what_the_h100_lost(make_claim, tmp_path):
    """The H100 (2026-11-22): 30/70 clients of 4096 matmuls, the 30-client 30.1 % of the pair's
    work, the pair 75 % of solo."""
    got = mps_launch(make_claim(), mps_client(tmp_path, "a", 30), mps_client(tmp_path, "b", 70))
    print(f"MPS 30/70: the 30-client {100 * got[0] / sum(got):.1f} % of the work, the pair {100 * sum(got):.1f} %")
    assert within(got[0] / sum(got), 0.301) and within(sum(got), 0.75), got


@pytest.mark.xfail(strict=True, reason="not reproduced (docs/compute.md, 'The simulated GPU'): the time slicing "
                   "of queued work loses at most the switches at slice ends (about 89 % of the GPU for a pair "
                   "that keeps it busy); the H100's launch-bound pair lost more, for a cause not known")
def test_a_launch_bound_pair_loses_what_the_h100_lost(make_claim):
    """Issue 29: on the H100 two processes launching 4 us elementwise kernels flat out, time-sliced,
    together did 60.6 % of what one did alone."""
    claim = make_claim()

    def launch(n: int) -> float:
        procs = [claim.popen("gpushare-probe", "launch", "--seconds", 1.5, "--kernel-us", 4, env={"LD_PRELOAD": ""})
                 for _ in range(n)]
        return sum(throughput(kv(p.communicate(timeout=60)[0]), 4) for p in procs)

    solo, pair = launch(1), launch(2)
    print(f"launch-bound: one alone {100 * solo:.1f} % of the GPU, two together {100 * pair:.1f} % "
          f"({100 * pair / solo:.1f} % of solo)")
    assert within(pair / solo, 0.606), (solo, pair)
