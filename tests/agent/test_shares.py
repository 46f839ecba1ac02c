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


def run_two_tenants(node):
    a, ids_a = node.claim(compute=30)
    b, ids_b = node.claim(compute=70)
    wa = node.run("a", ids_a, "launch", "--seconds", SECONDS)
    wb = node.run("b", ids_b, "launch", "--seconds", SECONDS)
    time.sleep(1.5)
    got = measured(node, a), node.share(b).measured * 100
    outs = wa.read_until("launches=", timeout=30), wb.read_until("launches=", timeout=30)
    # GPU share from the launch rate and the simulated kernel time (100 us)
    return got, [float(o["launches_per_s"]) * 100e-6 * 100 for o in outs]


def test_two_tenants_30_70_never_above_their_shares(node):
    (agent_a, agent_b), (a, b) = run_two_tenants(node)
    assert a <= 35 and b <= 75, (a, b)
    assert a >= 15 and b >= 55, (a, b)  # see the xfail below
    assert abs(agent_a - a) <= 5 and abs(agent_b - b) <= 5, (agent_a, a, agent_b, b)


@pytest.mark.xfail(strict=True, reason="Hard caps the agent's rate at the limit, and the library's launch cost "
                                       "includes queueing behind the other tenant, so both undershoot "
                                       "(docs/agent.md, known gaps)")
def test_two_tenants_30_70_within_5_points(node):
    _, (a, b) = run_two_tenants(node)
    assert abs(a - 30) <= 5 and abs(b - 70) <= 5, (a, b)


def test_burst_borrows_idle_time_and_hands_it_back(node):
    burst = [opaque_config(gpushare_config(computePolicy="Burst"))]
    a, ids_a = node.claim(compute=30, config=burst)
    b, ids_b = node.claim(compute=50)
    node.run("a", ids_a, "launch", "--seconds", "8")
    # alone on the GPU: the Burst claim takes the idle time
    wait_for(lambda: node.share(a).measured >= 0.8, timeout=4)
    node.run("b", ids_b, "launch", "--seconds", "4")
    started = time.monotonic()
    # the other claim needs its share: the borrowed time is handed back within one period
    wait_for(lambda: node.share(b).busy and node.share(a).rate <= 0.5 + 1e-6, timeout=3)
    handed_back = time.monotonic() - started
    assert handed_back <= 2 * node.plugin.agent.interval + 0.5, handed_back
    # A keeps its share plus what B leaves idle (20 %); B gets its share less the contention
    # undershoot of Hard pacing (see the 30/70 xfail)
    got_a, got_b = measured(node, a), node.share(b).measured * 100
    assert got_a <= 55 and got_b >= 35, (got_a, got_b)
