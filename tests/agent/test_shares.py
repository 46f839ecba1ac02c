"""Measured compute shares on the simulated GPU: the agent holds each claim to its share, and
Burst claims borrow idle time and hand it back (runs of a few seconds each)."""

from __future__ import annotations

import time

import pytest

from playground.claims import gpushare_config, opaque_config
from tests.support import CPU_TIMED, wait_for

SECONDS = "4"


def measured(node, ref, periods: int = 3) -> float:
    """The claim's share (percent) averaged over the next few agent periods."""
    got = []
    for _ in range(periods):
        time.sleep(node.plugin.agent.interval)
        got.append(node.share(ref).measured * 100)
    return sum(got) / len(got)


@CPU_TIMED
@pytest.mark.parametrize("share", [10, 30, 50, 90])
def test_single_claim_holds_its_share(node, share):
    ref, ids = node.claim(compute=share)
    w = node.run("spin", ids, "launch", "--seconds", SECONDS)
    time.sleep(1.5)  # convergence
    agent_view = measured(node, ref)
    out = w.read_until("launches=", timeout=30)
    assert abs(float(out["busy_share"]) - share) <= 5, out
    assert abs(agent_view - share) <= 5, agent_view


def run_two_tenants(node, seconds: float = 12.5, settle: float = 4.5):
    """A Hard claim at 30 % and one at 70 % on one GPU, both launching flat out. Returns the
    agent's per-period shares (percent) of both after `settle` seconds, and the shares the
    probes report for their whole run (launch rate x the simulated kernel time, 100 us)."""
    a, ids_a = node.claim(compute=30)
    b, ids_b = node.claim(compute=70)
    wa = node.run("a", ids_a, "launch", "--seconds", str(seconds))
    wb = node.run("b", ids_b, "launch", "--seconds", str(seconds))
    time.sleep(settle)  # the agent learns how far each claim's measured launch cost is overcharged
    periods = []
    while len(periods) < (seconds - settle - 1) / node.plugin.agent.interval:
        time.sleep(node.plugin.agent.interval)
        periods.append((node.share(a).measured * 100, node.share(b).measured * 100))
    outs = wa.read_until("launches=", timeout=30), wb.read_until("launches=", timeout=30)
    return periods, [float(o["launches_per_s"]) * 100e-6 * 100 for o in outs]


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


@CPU_TIMED
def test_two_tenants_30_70_within_4_points(node):
    """Large kernels (the H100's 4096 matmul, 2.65 ms) under 2.6 ms time slices with a 0.3 ms
    switch: the agent's slots hold the shares; NVML, sampled, only agrees roughly. Before issue
    29's slot handover 25.4 / 67.2 (bound 7); since, 28.2-29.3 / 68.0-69.0 in seven runs on a quiet
    machine: 4 points is about twice the worst miss."""
    a, ids_a = node.claim(compute=30)
    b, ids_b = node.claim(compute=70)
    wa = node.run("a", ids_a, "launch", "--seconds", "8", "--kernel-us", "2650")
    wb = node.run("b", ids_b, "launch", "--seconds", "8", "--kernel-us", "2650")
    # once both are busy: while only one is, its slot covers the other's (docs/compute.md)
    want = (0, 60000) if a.uid < b.uid else (140000, 60000)
    wait_for(lambda: node.plugin.agent.claims.get(a.uid) and (node.share(a).start_us, node.share(a).length_us) == want,
             what=f"claim a's slot {want}")
    outs = wa.read_until("launches=", timeout=30), wb.read_until("launches=", timeout=30)
    got = [float(o["launches"]) * 2650e-6 / float(o["seconds"]) * 100 for o in outs]
    print(f"30/70 under the plugin's agent, 2.65 ms kernels: {got[0]:.1f} / {got[1]:.1f}")
    assert abs(got[0] - 30) <= 4 and abs(got[1] - 70) <= 4, (got, outs)


@CPU_TIMED
def test_burst_borrows_idle_time_and_hands_it_back(node):
    burst = [opaque_config(gpushare_config(computePolicy="Burst"))]
    a, ids_a = node.claim(compute=30, config=burst)
    b, ids_b = node.claim(compute=50)
    node.run("a", ids_a, "launch", "--seconds", "10")
    # alone on the GPU: the Burst claim takes the idle time
    wait_for(lambda: node.share(a).measured >= 0.8, timeout=4)
    node.run("b", ids_b, "launch", "--seconds", "6")
    # the other claim needs its share from the moment the agent sees it busy (its process start
    # under a loaded CI machine is not part of the hand-back time)
    wait_for(lambda: node.share(b).busy, timeout=10)
    seen_busy = time.monotonic()
    # the borrowed time is handed back within one period
    wait_for(lambda: node.share(a).rate <= 0.5 + 1e-6, timeout=3)
    handed_back = time.monotonic() - seen_busy
    assert handed_back <= 2 * node.plugin.agent.interval + 0.5, handed_back
    # A keeps at most its share plus what B leaves idle (20 %); B, Hard with a control file,
    # holds its share: the agent's trusted rate makes up for the contention. Over four agent
    # periods (ten slot periods): one 0.5 s period holds 2.5 slot periods, and read alone it
    # once gave 55.3 / 39.8 (NVML's shares are sampled: the charged ones are read)
    time.sleep(node.plugin.agent.interval)
    got = []
    for _ in range(4):
        time.sleep(node.plugin.agent.interval)
        got.append((node.share(a).charged * 100, node.share(b).charged * 100))
    got_a, got_b = (sum(g[i] for g in got) / len(got) for i in (0, 1))
    assert got_a <= 55 and got_b >= 45, got


def test_the_agent_tells_the_library_how_many_processes_share_the_claim(node):
    """The control file's `procs` is the claim's processes on the GPU as NVML and the process map
    see them: a library that finds the claim's timeline in the region forged paces itself at
    rate / procs (tests/hook/test_forged_timeline.py)."""
    from kubeletplugin.agent.control import Control

    ref, ids = node.claim(compute=25)
    for n in range(3):
        node.run(f"p{n}", ids, "launch", "--seconds", "8")
    control = Control(node.plugin.driver.files.control_path(ref.uid, 0))
    try:
        wait_for(lambda: control.procs == 3, timeout=15, what="procs == 3 in the control file")
    finally:
        control.close()


def test_control_file_says_when_contexts_nobody_paces_share_the_gpu(node):
    """A claim of strategy None (no library) or MPS (its server is one context that keeps no
    slot) on the GPU: the agent tells the time-sliced claims' libraries, which then pace without
    the slot handover (docs/compute.md); when it goes, they pace with it again."""
    from kubeletplugin.agent.control import Control

    ref, _ = node.claim(compute=25)
    control = Control(node.plugin.driver.files.control_path(ref.uid, 0))
    try:
        time.sleep(2 * node.plugin.agent.interval)
        assert control.unpaced is False  # only paced claims on the GPU
        other, _ = node.claim(compute=25, config=[opaque_config(gpushare_config(sharingStrategy="None"))])
        wait_for(lambda: control.unpaced is True, timeout=10, what="unpaced in the control file")
        node.kubelet.unprepare(other)
        wait_for(lambda: control.unpaced is False, timeout=10, what="unpaced cleared")
    finally:
        control.close()
