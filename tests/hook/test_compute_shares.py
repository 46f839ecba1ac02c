"""Compute shares under time slicing (the simulated driver's contexts alternate in 2.6 ms
slices with a 0.3 ms switch, as on the H100 measured in docs/compute.md). Claims get the per-GPU time slots the node
agent publishes in their control files (kubeletplugin/agent/shares.py computes the same layout);
shares are each claim's GPU time in one run, from its launch count and the simulated kernel
length. Both large and tiny kernels hold 3.5 points here (misses of at most 1.7 on a quiet
machine; tiny ones depend on how fast a loaded CI machine can launch)."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubeletplugin.agent.control import Control
from kubeletplugin.agent.shares import PERIOD_US
from kubeletplugin.hooklayout import CONTROL, REGION_HEADER
from tests.support import CPU_TIMED, MiB, wait_for
from tests.support.hook import kv

ROOT = Path(__file__).resolve().parents[2]

SECONDS = 6
LARGE_US = 2650  # a 4096x4096 fp32 matmul on the H100
TINY_US = 50


def slots(limits, period_us=PERIOD_US):
    out, start = [], 0
    for limit in limits:
        length = period_us * limit // 100
        out.append((period_us, start, length))
        start += length
    return out


def start_claims(make_claim, limits):
    claims = []
    for i, (limit, slot) in enumerate(zip(limits, slots(limits), strict=True)):
        c = make_claim(compute=limit, name=f"c{i}")
        c.write_control(limit * 10_000, slot=slot)
        claims.append(c)
    return claims


def run_claims(make_claim, limits, kernel_us, seconds=SECONDS):
    """Each claim (Hard) launches kernel_us kernels flat out; returns each one's share of GPU
    time (percent of the run)."""
    claims = start_claims(make_claim, limits)
    procs = [c.popen("gpushare-probe", "launch", "--seconds", seconds, "--kernel-us", us)
             for c, us in zip(claims, kernel_us, strict=True)]
    outs = [kv(p.communicate(timeout=120)[0]) for p in procs]
    shares = [float(o["launches"]) * us / 1e6 / float(o["seconds"]) * 100
              for o, us in zip(outs, kernel_us, strict=True)]
    return shares, outs


# Issue 29: on the simulator calibrated to the H100's context switch and slice ends (a context
# that gets work waits for the next one), the slots kept busy claims apart only once each slot
# began on an idle GPU and drained before it ended (docs/compute.md, "the slot handover"; 200 ms
# period). Before: 24.9 / 66.7 (30/70 large), 25.2 / 67.6 (mixed), 15.8-16.6 / 25.0-26.0 /
# 46.1-46.7 (20/30/50), 30.0 / 61.0-63.0 (tiny), held by bounds of 7 and 11. Measured since, on a
# quiet machine (two runs each): 29.4 / 68.3-68.9, 29.1-29.2 / 69.0-69.3, 18.7-18.8 / 28.7-28.8 /
# 48.4-49.1, 29.6-29.7 / 68.8-69.0; together 96.0-98.6 %: misses of at most 1.7 points, bounded
# here at about twice that (the CPU of a loaded CI machine moves the launch-bound ones most).
@pytest.mark.parametrize("limits,kernel_us,bound", [
    ([30, 70], [LARGE_US, LARGE_US], 3.5),
    ([30, 70], [LARGE_US, TINY_US], 3.5),
    ([20, 30, 50], [LARGE_US] * 3, 3.5),
    ([30, 70], [TINY_US, TINY_US], 3.5),
])
@CPU_TIMED
def test_shares_hold_and_the_gpu_stays_busy(make_claim, limits, kernel_us, bound):
    shares, outs = run_claims(make_claim, limits, kernel_us)
    print(f"limits {limits}, kernels {kernel_us} us: shares {[round(x, 1) for x in shares]}, "
          f"together {sum(shares):.1f}")
    for got, limit in zip(shares, limits, strict=True):
        assert abs(got - limit) <= bound, (shares, outs)
    # the GPU stays busy: time slicing alone does 89.6 % (a switch every slice), the slots lose a
    # switch per slot and what is left of a slot after its last whole kernel
    assert sum(shares) >= 92, (shares, outs)


# When the agent moves the slots (a new period: every slot moves), each claim's queued work meets the
# next claim's slot, and both time-slice until it has run. The library saw how late its queue was
# only at its launches, not while it waited for the queue: each slot ended with most of a queue
# (10 ms) still to run, which made the next claim's queue late in turn, and so on for as long as the
# claims ran (20/30/50 of 2.65 ms kernels after moving to 400 ms: 17-32 ms past every slot's end, the
# GPU 96-97 % busy, 1-2 points off each share). Now its wait for the queue adds the lateness it sees
# to the queue's predicted end, and the claims settle within a period: 99.3-99.4 % busy.
@CPU_TIMED
def test_after_the_slots_move_the_claims_settle_back_into_them(make_claim):
    limits = [20, 30, 50]
    claims = start_claims(make_claim, limits)
    procs = [c.popen("gpushare-probe", "launch", "--seconds", 8, "--kernel-us", LARGE_US) for c in claims]
    time.sleep(2)
    for c, (period, start, length) in zip(claims, slots(limits, 2 * PERIOD_US), strict=True):
        control = Control(str(c.root / "control" / "0"))
        control.set_slot(period, start, length)
        control.close()
    time.sleep(1.5)  # a few periods to settle in

    def charged_ns():
        return [REGION_HEADER["pace_gpu_ns"].read(c.region(0).read_bytes()) for c in claims]

    t0, before = time.monotonic(), charged_ns()
    time.sleep(8 * 2 * PERIOD_US / 1e6)  # whole periods: each claim's slot comes as often in the window
    t1, after = time.monotonic(), charged_ns()
    outs = [kv(p.communicate(timeout=60)[0]) for p in procs]
    shares = [(b - a) / 1e9 / (t1 - t0) * 100 for a, b in zip(before, after, strict=True)]
    print(f"20/30/50 of {LARGE_US} us kernels, settled after the slots moved: {[round(x, 1) for x in shares]}, "
          f"together {sum(shares):.1f}")
    assert sum(shares) >= 98.5, (shares, outs)
    for got, limit in zip(shares, limits, strict=True):
        assert abs(got - limit) <= 1, (shares, outs)


@CPU_TIMED
def test_alone_at_30_gets_30_of_solo(make_claim):
    shares, outs = run_claims(make_claim, [30], [LARGE_US], seconds=4)
    assert abs(shares[0] - 30) <= 2, outs


def test_a_launch_bound_claim_never_gets_more_than_its_share(make_claim):
    """4 us kernels, each launch costing the thread 3.2 us in the simulated driver: the GPU idles
    between kernels, one stretch of running per kernel. The library's cost samples, read 10 ms
    after their events beside the probe's event every 16 launches, used to lose their time in
    the simulator's ring of 32 watched events and read below the kernel's length, so a Hard 30
    claim took 39 % of the GPU alone (issue 29). The CPU decides how far below 30 it stays
    (each sample with the GPU idle at its launch counts the launch too): no lower bound here."""
    shares, outs = run_claims(make_claim, [30], [4], seconds=3)
    assert shares[0] <= 32, outs


def test_forged_region_cannot_raise_the_share(make_claim):
    """A process of the claim keeps resetting the region's bucket and rate: each process also
    keeps its own bucket, so the claim stays at its limit."""
    [c] = start_claims(make_claim, [30])
    c.run("gpushare-probe", "meminfo")  # initialise the region
    with c.forging({"pace_tat_ns": 0, "pace_rate_ppm": 1_000_000}, 0.0005):  # all of the GPU
        p = c.popen("gpushare-probe", "launch", "--seconds", 4, "--kernel-us", LARGE_US)
        out = kv(p.communicate(timeout=60)[0])
    share = float(out["launches"]) * LARGE_US / 1e6 / float(out["seconds"]) * 100
    assert share <= 33, out


def serve(claim, preload=True):
    p = claim.run("gpushare-probe", "serve", "--seconds", 3, preload=preload, timeout=60)
    out = kv(p.stdout)
    return float(out["p50_ms"]), float(out["p99_ms"]), out


def paced_ms(claim):
    """Wall time the claim's launches slept to hold its share (the region's paced_ns)."""
    return REGION_HEADER["paced_ns"].read(claim.region(0).read_bytes()) / 1e6


def test_claim_under_its_share_is_not_paced(make_claim):
    """An inference-like client at 50 (uses about 12 %) beside a busy neighbour at 50 is never
    held by the library once its kernel cost is measured, and its p50 stays within 1.2x of what
    plain time slicing gives it beside the same neighbour unpaced (the H100: 0.49 ms against
    0.41 solo; the simulator makes a request wait for the neighbour's slice end, about 2 ms).

    What the library adds is the time it sleeps (paced_ns), so that is what is checked: nothing
    from the second second on. Its first cost samples, taken while the neighbour's slice runs,
    count that slice, so the client can be held for a few periods at start-up (40-80 ms seen;
    docs/compute.md). The p99 that time slicing itself costs depends on the CPU here and is a
    speed figure: hack/bench-share prints it beside solo and plain time slicing."""
    client, neighbour = start_claims(make_claim, [50, 50])
    unpaced = neighbour.popen("gpushare-probe", "launch", "--seconds", 4, "--kernel-us", LARGE_US,
                              env={"LD_PRELOAD": ""})
    plain = serve(client, preload=False)
    unpaced.communicate(timeout=60)
    busy = neighbour.popen("gpushare-probe", "launch", "--seconds", 5, "--kernel-us", LARGE_US)
    p = client.popen("gpushare-probe", "serve", "--seconds", 3)
    time.sleep(1)
    warm = paced_ms(client)
    paced = kv(p.communicate(timeout=60)[0])
    busy.communicate(timeout=60)
    after = paced_ms(client)
    assert paced_ms(neighbour) > 1000, "the neighbour was not paced: the check below proves nothing"
    assert after - warm == 0, (warm, after, paced)
    assert warm < 500, (warm, paced)
    assert float(paced["p50_ms"]) <= 1.2 * plain[0] + 0.05, (plain, paced)


def run_with_agent(claims, probes):
    """claims with the share agent (`gpushare-dra share-agent`, 0.25 s periods) writing their
    slots, each running its probe arguments; returns each one's share of GPU time (percent)"""
    agent = subprocess.Popen([sys.executable, "-m", "dra_driver.cli", "share-agent", "--interval", "0.25",
                              "--log-level", "warning", *(str(c.root) for c in claims)], cwd=ROOT)
    try:  # a library that starts before its control file has a slot runs without slots for its life
        wait_for(lambda: all((c.root / "control" / "0").exists() and
                             CONTROL["slot"].read((c.root / "control" / "0").read_bytes()) >> 32 for c in claims),
                 timeout=30, what="the agent's slots")
        procs = [c.popen("gpushare-probe", "launch", *args) for c, args in zip(claims, probes, strict=True)]
        time.sleep(float(probes[0][probes[0].index("--seconds") + 1]) / 2)  # the period they run in, halfway
        periods = [CONTROL["period_us"].read((c.root / "control" / "0").read_bytes()) for c in claims]
        outs = [kv(p.communicate(timeout=120)[0]) for p in procs]
        for o, period in zip(outs, periods, strict=True):
            o["period_us"] = period
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    kernel_us = [float(args[args.index("--kernel-us") + 1]) for args in probes]
    return [float(o["launches"]) * us / 1e6 / float(o["seconds"]) * 100
            for o, us in zip(outs, kernel_us, strict=True)], outs


# A bursty Hard 50 (kernels of 2.65 ms for on_ms, waited for, then off_ms idle) beside a steady
# Burst 50. The agent sees both busy in every period: with slots alone the Burst claim borrowed
# nothing (50 ms on, 150 off: the GPU 73.5 % busy), with the lent span (the idle tail of the Hard
# slot, given up at the first sign of the owner's work) 82-89 %. The Burst claim now fills behind
# the Hard claim (docs/compute.md, "The fill"): it launches whenever the agent's relay says the
# Hard claim has no work, and the Hard claim's slot is the period, so its bursts go where they
# come: 98.4 / 97.9 % busy, the Hard claim 24.1 / 32.6 (with the lent span 24.0-24.5 / 34.1-34.6;
# ideal 25 / 35: each burst waits behind the Burst claim's kernel in flight).
@pytest.mark.parametrize("on_ms,off_ms,hard_min,busy_min", [(50, 150, 22, 95), (70, 130, 31, 95)])
@CPU_TIMED
def test_a_burst_claim_fills_the_time_a_bursty_hard_neighbour_leaves_idle(make_claim, on_ms, off_ms, hard_min,
                                                                          busy_min):
    hard = make_claim(compute=50, name="hard")
    burst = make_claim(gpus=[{"memory": 64 * MiB, "compute": 50, "policy": "Burst"}], name="burst")
    seconds = ["--seconds", SECONDS, "--kernel-us", LARGE_US]
    (got_hard, got_burst), outs = run_with_agent([hard, burst], [
        [*seconds, "--on-ms", on_ms, "--off-ms", off_ms], seconds])
    print(f"bursty Hard 50 ({on_ms}/{off_ms} ms) + steady Burst 50: {got_hard:.1f} / {got_burst:.1f}, "
          f"busy {got_hard + got_burst:.1f}")
    assert got_hard >= hard_min, (got_hard, got_burst, outs)
    assert got_hard + got_burst >= busy_min, (got_hard, got_burst, outs)


# Without the fill (a second Burst claim on the GPU, idle here: two fillers would time-slice each
# other with nothing to hold them to their limits) the busy Burst claim is lent the idle tail of the
# bursty Hard claim's slot, less a margin ("the lent span", docs/compute.md), where it launches
# while the GPU runs nothing else and which it gives up at the first sign of the owner's work:
# 76.5-81.5 % busy (2026-11-26, 5 runs); with no span lent, 72.0-72.2.
@CPU_TIMED
def test_beside_a_second_burst_claim_a_burst_claim_borrows_the_idle_tail_of_a_bursty_hard_slot(make_claim):
    hard = make_claim(compute=50, name="hard")
    burst = make_claim(gpus=[{"memory": 64 * MiB, "compute": 30, "policy": "Burst"}], name="burst")
    other = make_claim(gpus=[{"memory": 64 * MiB, "compute": 20, "policy": "Burst"}], name="other")
    seconds = ["--seconds", SECONDS, "--kernel-us", LARGE_US]
    (got_hard, got_burst, got_other), outs = run_with_agent([hard, burst, other], [
        [*seconds, "--on-ms", 50, "--off-ms", 150], seconds, [*seconds, "--on-ms", 1, "--off-ms", 100_000]])
    print(f"bursty Hard 50 (50/150 ms) + steady Burst 30 + idle Burst 20: {got_hard:.1f} / {got_burst:.1f} / "
          f"{got_other:.1f}, busy {got_hard + got_burst + got_other:.1f}")
    assert got_hard >= 22, (got_hard, got_burst, outs)
    assert got_hard + got_burst + got_other >= 75, (got_hard, got_burst, outs)


# The relay passes on what the Hard claim's region says, which its tenant writes: one that keeps
# its charged GPU time moving and its queue end ahead while it launches nothing would keep the
# filling Burst claim waiting as long as it forges (with the library's bound taken out: no work
# done in the window). The Burst claim keeps its own timeline at 95 % of its limit and stops
# waiting once 50 ms behind it. Its share here is its work done within the probe's window (a launch held past
# the window's end would count in its launches).
FORGER = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, 4096)
words = memoryview(m).cast("Q")
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    if words[0]:  # the library has initialised the region
        words[136 // 8] += 1000      # pace_gpu_ns: "a launch"
        words[168 // 8] = time.monotonic_ns() + 20_000_000  # pace_qend_ns: "work for 20 ms"
    time.sleep(0.0005)
"""


@CPU_TIMED
def test_a_hard_tenant_forging_launches_cannot_keep_the_filling_burst_claim_below_its_limit(make_claim):
    hard = make_claim(compute=50, name="hard")
    burst = make_claim(gpus=[{"memory": 64 * MiB, "compute": 50, "policy": "Burst"}], name="burst")
    assert REGION_HEADER["pace_gpu_ns"].offset == 136 and REGION_HEADER["pace_qend_ns"].offset == 168
    forger = subprocess.Popen([sys.executable, "-c", FORGER, str(hard.root / "region" / "0"), str(SECONDS + 20)])
    try:
        _, outs = run_with_agent([hard, burst], [  # the Hard claim: one kernel, then idle
            ["--seconds", SECONDS, "--kernel-us", LARGE_US, "--on-ms", 1, "--off-ms", 100_000],
            ["--seconds", SECONDS, "--kernel-us", LARGE_US]])
    finally:
        forger.kill()
        forger.wait()
    got_burst = int(outs[1]["done_in_window"]) * LARGE_US / 1e6 / float(outs[1]["window_s"]) * 100
    print(f"Burst 50 beside a Hard 50 that forges its launches: {got_burst:.1f}")
    assert 45 <= got_burst <= 75, (got_burst, outs)


# A slot holds whole kernels (the handover drains a claim's work before its slot ends), so with a
# 200 ms period a Hard 10 claim of 12 ms kernels beside a Hard 90 one fit one kernel in its 20 ms
# slot: 6.2-7.2 % (issue 29's untuned case). The agent now lengthens the GPU's period until no busy
# claim's slot loses more than 1 % of it after its last whole kernel, reckoned with the longest
# launch its library reports (400 ms here: a 40 ms slot holds 3 kernels); its neighbour keeps its share.
@CPU_TIMED
def test_a_claim_of_kernels_longer_than_its_slot_gets_its_share(make_claim):
    small, large = make_claim(compute=10, name="long-kernels"), make_claim(compute=90, name="neighbour")
    (got_small, got_large), outs = run_with_agent([small, large], [
        ["--seconds", SECONDS, "--kernel-us", 12_000], ["--seconds", SECONDS, "--kernel-us", LARGE_US]])
    print(f"Hard 10 of 12 ms kernels + Hard 90: {got_small:.1f} / {got_large:.1f}, period {outs[0]['period_us']} us")
    assert outs[0]["period_us"] == 400_000, outs
    assert abs(got_small - 10) <= 2, (got_small, got_large, outs)
    assert got_large >= 86, (got_small, got_large, outs)


@CPU_TIMED
def test_a_forged_kernel_length_stretches_the_period_but_moves_no_share(make_claim):
    """The longest launch is the claim's own report (the region): a tenant that keeps it at 20 ms
    (its 30 % slot then loses 19.7 ms in every period up to 1 s) stretches its GPU's slot period to
    the most, and its 70 % neighbour keeps its share. (A length longer than the slot stretches
    nothing: such a slot loses no tail.) After a 2 s warm-up: with 1 s periods the claims' first one
    (costs not known yet: 26.2 / 66.4 % of it) moves a share of a few periods. Before the library
    bounded its real queue (queue_bound) the neighbour read 63.5-67.8 here: both claims' queues
    grew to 100-190 ms and spilled into each other's slots."""
    forger, neighbour = make_claim(compute=30, name="forger"), make_claim(compute=70, name="neighbour")
    forger.run("gpushare-probe", "meminfo")  # initialise the region
    with forger.forging({"pace_kernel_us": 20_000}, 0.001):
        (got_forger, got_neighbour), outs = run_with_agent([forger, neighbour], [
            ["--seconds", 8, "--warmup", 2, "--kernel-us", LARGE_US]] * 2)
    print(f"forged kernel length, 30/70: {got_forger:.1f} / {got_neighbour:.1f}, period {outs[0]['period_us']} us")
    assert outs[0]["period_us"] == outs[1]["period_us"] == 1_000_000, outs
    assert got_forger <= 33.5 and got_neighbour >= 66.5, (got_forger, got_neighbour, outs)
