"""Measured compute shares on the simulated GPU: the agent holds each claim to its share, and
Burst claims borrow idle time and hand it back (runs of a few seconds each)."""

from __future__ import annotations

import time

import pytest

from tests.kubeletplugin.kubelet import gpushare_config, opaque_config

from .conftest import wait_for

SECONDS = "4"


def measured(node, ref, periods: int = 3) -> float:
    """The claim's share (percent) averaged over the next few agent periods."""
    got = []
    for _ in range(periods):
        time.sleep(node.plugin.agent.interval)
        got.append(node.share(ref).measured * 100)
    return sum(got) / len(got)


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


@pytest.mark.xfail(strict=True, reason="issue 10: under time slicing the 30 claim gets about 21 %")
def test_two_tenants_30_70_within_5_points(node):
    # Each tenant's event-timed launch cost includes queueing behind the other's kernels; the
    # agent's rate in the trusted control file (above the limit, under Hard) makes up for it.
    periods, probes = run_two_tenants(node)
    a, b = mean(p[0] for p in periods), mean(p[1] for p in periods)
    assert abs(a - 30) <= 5 and abs(b - 70) <= 5, (a, b, periods)
    # the whole runs, convergence included, stay near the shares too, never well above
    assert probes[0] <= 35 and probes[1] <= 75 and probes[0] >= 20 and probes[1] >= 60, probes


def test_burst_borrows_idle_time_and_hands_it_back(node):
    burst = [opaque_config(gpushare_config(computePolicy="Burst"))]
    a, ids_a = node.claim(compute=30, config=burst)
    b, ids_b = node.claim(compute=50)
    node.run("a", ids_a, "launch", "--seconds", "8")
    # alone on the GPU: the Burst claim takes the idle time
    wait_for(lambda: node.share(a).measured >= 0.8, timeout=4)
    node.run("b", ids_b, "launch", "--seconds", "4")
    # the other claim needs its share from the moment the agent sees it busy (its process start
    # under a loaded CI machine is not part of the hand-back time)
    wait_for(lambda: node.share(b).busy, timeout=10)
    seen_busy = time.monotonic()
    # the borrowed time is handed back within one period
    wait_for(lambda: node.share(a).rate <= 0.5 + 1e-6, timeout=3)
    handed_back = time.monotonic() - seen_busy
    assert handed_back <= 2 * node.plugin.agent.interval + 0.5, handed_back
    # A keeps at most its share plus what B leaves idle (20 %); B, Hard with a control file,
    # holds its share: the agent's trusted rate makes up for the contention
    got_a, got_b = measured(node, a), node.share(b).measured * 100
    assert got_a <= 55 and got_b >= 45, (got_a, got_b)
