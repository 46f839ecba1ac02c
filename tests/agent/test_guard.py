"""The compute guard's rules (kubeletplugin/agent/guard.py) on NVML's noise, and its stops on real
processes. The measured shares are drawn as the driver samples them (five samples a second, each
naming the one context resident at that instant: test_compute_guard.py runs the real thing on the
simulated GPU)."""

from __future__ import annotations

import json
import random
import subprocess
import time

import pytest

from kubeletplugin.agent.guard import HOLD, KILL, RELEASE_S, REPORT, Guard, Member, signal_pids, stop_all
from kubeletplugin.agent.procmap import start_time

SAMPLES_PER_S = 5
PERIOD_S = 1.0


def sampled(rng: random.Random, shares: list[float]) -> list[float]:
    """One period's measured shares of claims whose true shares are `shares`."""
    counts = [0] * len(shares)
    for _ in range(int(SAMPLES_PER_S * PERIOD_S)):
        x, acc = rng.random(), 0.0
        for i, s in enumerate(shares):
            acc += s
            if x < acc:
                counts[i] += 1
                break
    return [c / (SAMPLES_PER_S * PERIOD_S) for c in counts]


def run(guard: Guard, limits: list[float], shares, seconds: float, rng: random.Random | None,
        wanting: tuple[bool, ...] | None = None) -> None:
    """`shares(t)`: the claims' true shares at t, measured as sampled (rng None: exactly);
    `wanting`: which claims' libraries held launches back (default: all)."""
    t = 0.0
    while t < seconds:
        measured = sampled(rng, shares(t)) if rng else shares(t)
        members = [Member((f"c{i}", 0), limit, m, wanting[i] if wanting else True)
                   for i, (limit, m) in enumerate(zip(limits, measured, strict=True))]
        guard.observe([members], PERIOD_S)
        t += PERIOD_S


@pytest.mark.parametrize("limits", [[0.25, 0.75], [0.5, 0.5], [0.25, 0.5, 0.25]])
def test_honest_claims_at_their_shares_are_never_held_in_hours_of_noise(limits):
    actions = []
    guard = Guard("kill", lambda key, action, limit, measured: actions.append((key, action, measured)) or True)
    for seed in range(3):
        run(guard, limits, lambda t: limits, 3600, random.Random(seed))
    assert not actions


def timed_guard() -> tuple[Guard, list[tuple[str, str, float]]]:
    """A guard that kills, and its actions: (claim, action, the claim's clock then)."""
    actions: list[tuple[str, str, float]] = []
    guard = Guard("kill", lambda key, action, limit, measured: actions.append((key[0], action, guard.claims[key].clock))
                  or True)
    return guard, actions


def test_a_bypassing_claim_is_killed_within_10_s_when_its_neighbour_is_short():
    """Issue 40's forger (67 % at a limit of 25, its neighbour at 33 of 75): its excess and its
    neighbour's loss are both established within one window, so it is killed at once (a hold does
    not drain its queued work in time). Five samples a second take time to be sure: in 300 runs it
    was killed after 4-9 s of attack in 94 %, after 10-14 s in the rest."""
    kill_s = []
    for seed in range(40):
        guard, actions = timed_guard()
        # honest for a minute, then the attack
        run(guard, [0.25, 0.75], lambda t: [0.25, 0.75] if t < 60 else [0.67, 0.33], 80, random.Random(seed))
        assert actions and actions[0][:2] == ("c0", KILL), (seed, actions)
        kill_s.append(actions[0][2] - 60)  # seconds of the attack before the kill
        assert guard.claims[("c0", 0)].held  # what restarts is held
    kill_s.sort()
    assert kill_s[int(len(kill_s) * 0.9)] <= 10 and kill_s[-1] <= 15, kill_s


def test_a_subtle_forger_among_three_claims_is_caught_by_the_long_window():
    """Issue 40's three-claim forger: 32 % at a limit of 25, its neighbours at 37 of 50 and 19 of 25
    (no attack: 24 / 44 / 24). Seven points are about one standard deviation of 50 samples (10 s):
    five samples a second need about 1,000 (200 s) to put 5 sigma between 25 and 32 %, so only the
    300 s window can be sure of it: caught within 300 s in 18 of 20 runs (the last at 434 s); at
    31 %, in 13 of 20 (19 within 600 s). The guard's limit: docs/security.md."""
    for seed in range(3):
        guard, actions = timed_guard()
        run(guard, [0.25, 0.5, 0.25], lambda t: [0.32, 0.37, 0.19], 400, random.Random(seed))
        assert actions and actions[0][:2] == ("c0", KILL) and actions[0][2] <= 300, (seed, actions)


# three claims: c1 idle (it wants nothing), c2 wanting; the excess of c0 comes mostly from c1's idle time
LIMITS3, WANTING3 = [0.25, 0.25, 0.5], (True, False, True)


def test_a_claim_over_its_share_while_its_neighbour_is_barely_short_is_held_not_killed():
    """62 % at a limit of 25, mostly out of an idle neighbour's time, while the wanting neighbour
    lost 17 of its 50 (less than 3 sigma of its samples over 10 s): held, not killed."""
    actions = []
    guard = Guard("kill", lambda key, action, limit, measured: actions.append((key[0], action)) or True)
    run(guard, LIMITS3, lambda t: [0.62, 0.05, 0.33], 12, None, WANTING3)
    assert actions == [("c0", HOLD)] and guard.held(), actions


def test_a_held_claim_that_goes_back_to_its_share_is_let_go_and_seldom_killed():
    """The kill after a hold is a 3-sigma rule on the neighbours' samples: a held claim back at its
    share is still killed about once in 30 holds like this one (2.5 minutes each)."""
    kills = 0
    for seed in range(5):
        actions: list[str] = []
        guard = Guard("kill", lambda key, action, limit, measured, actions=actions: actions.append(action) or True)
        run(guard, LIMITS3, lambda t: [0.62, 0.05, 0.33], 10, None, WANTING3)
        assert actions == [HOLD], actions
        # the hold worked: under its share, measured as sampled
        run(guard, LIMITS3, lambda t: [0.15, 0.05, 0.5], 120 + RELEASE_S, random.Random(seed), WANTING3)
        assert not guard.claims[("c0", 0)].held and not guard.held()
        kills += actions.count(KILL)
    assert kills <= 1


def test_report_mode_tells_once_and_neither_stops_nor_kills():
    actions = []
    guard = Guard("report", lambda key, action, limit, measured: actions.append(action) or True)
    run(guard, [0.25, 0.75], lambda t: [0.67, 0.33], 40, random.Random(3))
    assert actions == [REPORT] and guard.held() == {}
    assert guard.claims[("c0", 0)].kills == 0


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def test_stop_all_stops_a_process_that_another_keeps_resuming():
    victim = subprocess.Popen(["sleep", "60"])
    resumer = subprocess.Popen(["sh", "-c", f"while :; do kill -CONT {victim.pid}; done"])
    try:
        time.sleep(0.1)
        stop_all([victim.pid, resumer.pid])
        time.sleep(0.05)  # a resume sent before the resumer stopped would show by now
        assert state(victim.pid) == "T" and state(resumer.pid) == "T"
        signal_pids([victim.pid, resumer.pid], 18)  # SIGCONT
        time.sleep(0.05)
        assert state(victim.pid) != "T"
    finally:
        for p in (victim, resumer):
            p.kill()
            p.wait()


def test_processes_a_dead_agent_left_stopped_are_resumed_by_the_next(tmp_path):
    """The record names each held process with its start time: the next agent resumes those, and
    never a process that has its pid but started later."""
    held, other = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    record = tmp_path / "guard-held.json"
    try:
        stop_all([held.pid, other.pid])
        record.write_text(json.dumps({str(held.pid): start_time(held.pid), str(other.pid): start_time(other.pid) + 1}))
        Guard("kill", record=str(record)).resume()
        time.sleep(0.05)
        assert state(held.pid) != "T" and state(other.pid) == "T"
        assert not record.exists()
    finally:
        for p in (held, other):
            p.kill()
            p.wait()
