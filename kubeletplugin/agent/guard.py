"""The compute guard: a claim's compute share held from outside its processes (docs/security.md,
"Compute: the guard").

The library's pacing (hook/src/pacing.c) is fast and exact, and runs inside the tenant's processes:
a tenant that bypasses it (a private loader, the rename attack) or forges what its processes share
in the region (the timeline, the turn) launches as it likes. The guard rests only on what tenants
cannot write: NVML's per-process utilization (the driver's samples), mapped to claims by the
process map (kernel and API-server facts), and the kernel's job control.

NVML samples five times a second, each sample naming the one context resident at that instant, so
a claim's measured share is a count of samples: over a window of n samples its noise is
sqrt(p(1 - p) / n), 7 points over 10 s at a share of 50 %. So the guard holds a claim only when it
is far over its share for a whole window while a neighbour on the GPU is short of its own and wants it:

- suspected: over one of WINDOWS_S its measured share is over its limit by 5 standard deviations
  of the window's samples (a claim of 25 %: 43 points over 5 s, 31 over 10 s, 15 over 40 s, 6 over
  300 s), while a neighbour that wants more (its library held launches back) is short of its own
  share. An honest claim is held by its library to its share (and goes past it only into time its
  neighbours leave idle, when none wants it), so it is never suspected but by a 5-sigma run of
  samples;
- killed at once (--enforce=kill) when, over that same window, its wanting neighbours are also
  short by 3 standard deviations of their samples: the harm is established, and a hold cannot take
  back the GPU work its processes have queued (seconds of it: below), so only a kill makes the
  neighbours whole within the window after the one that caught it. It stays held, so what
  restarts is held from its first launch;
- held (the excess established but not yet the neighbours' loss, as where idle time absorbs it):
  in each period of its GPU's time slots (shares.py) its processes (every process of their
  containers) run from the start of its slot for a part `run` of the period and are stopped
  (SIGSTOP) for the rest, so its work meets its neighbours' as little as it would paced. `run`
  starts at FIRST_RUN and shrinks by factors while the measured share is over HOLD_TARGET below
  its limit and a neighbour is short (the GPU work a process queues while it runs is drained
  while it is stopped), else doubles each second;
- killed (--enforce=kill) when, held, its neighbours stay short by 3 standard deviations of their
  samples over ESCALATE_S while it still takes more than its share: its processes on the GPU and
  their containers are killed, as the memory backstop kills;
- released: once over RELEASE_S it took no more than its share and was barely stopped (run >= 1/2).

Stopped processes keep their GPU work queued: the GPU runs it meanwhile, which the measured share
counts, so the controller stops them longer, and a queue of long kernels can keep the neighbours
short whatever the hold: hence the kill. Under --enforce=report nothing is stopped or killed: the
first action of a hold is reported (REPORT) and nothing else. A process of the container that resumes another
(SIGCONT) is stopped in the same round (every process of the container is stopped, in rounds
until all are). A Warning Event `GpuComputeShareExceeded` names the claim when its hold starts, and
`gpushare_claim_compute_held_seconds_total` counts the time its processes were stopped.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cdi import remove_durable, write_atomic
from dra_driver.log import get_logger

from .backstop import cgroup_pidfds
from .procmap import start_time

log = get_logger("agent.guard")

SAMPLES_PER_S = 5      # NVML's per-process samples (docs/compute.md)
WINDOWS_S = (5.0, 10.0, 40.0, 300.0)  # a claim is judged over each of these
SIGMAS = 5.0           # how far over its limit, in standard deviations of the window's samples
LONG_WINDOW_S = WINDOWS_S[-1]
NEIGHBOUR_SHORT = 0.05  # neighbours whose measured shares are under their limits by this (a window's mean) are short
CONTENDED_S = 2.0      # the window in which a held claim's controller looks for a short neighbour
ESCALATE_S = 10.0      # a hold that leaves its neighbours short this long: the claim's processes are killed
ESCALATE_SIGMAS = 3.0  # short by this many standard deviations of their samples (short_by)
HOLD_TARGET = 0.04     # a held claim is driven to its limit less this
FIRST_RUN = 0.01       # of each period, a held claim runs at first
MIN_RUN = 0.00002      # and never less (4 us of a 200 ms period: in effect, resumed and stopped again at once)
RATE = 3.0             # the run part shrinks by exp(RATE x excess over the target) a second
SMOOTHING = 0.4        # weight of a period's measured share in the controller's average
CYCLE_S = 0.2          # a hold's period where the claim has no slot
RELEASE_S = 30.0       # a hold ends once the claim stayed within its share this long, barely stopped
STOP_ROUNDS = 4        # a process resumed by another of its container is stopped again


@dataclass
class ClaimGuard:
    """The guard's state of one (claim, GPU)."""

    limit: float
    periods: deque[tuple[float, float, float]] = field(default_factory=deque)  # (seconds, measured, shortfall)
    run: float = 1.0           # of each period its processes run (1: not stopped)
    held: bool = False
    average: float = 0.0       # the controller's measured share
    acted_at: float = 0.0      # when its hold started or its processes were last killed
    held_s: float = 0.0        # stopped, all told (the metric)
    kills: int = 0             # times its processes were killed (the metric)
    clock: float = 0.0         # its periods' seconds, all told: the time its rules count in
    wanting_limit: float = 0.0  # the shares of the neighbours that wanted more, last period
    slot: tuple[int, int] = (0, 0)  # its slot as last planned: (period, start) us (Member.slot)

    def window(self, seconds: float) -> tuple[float, float, float]:
        """(covered seconds, mean measured share, mean shortfall of its busiest-short neighbour)
        over the newest `seconds`."""
        covered = share = short = 0.0
        for dt, measured, shortfall in reversed(self.periods):
            if covered >= seconds:
                break
            covered += dt
            share += measured * dt
            short += shortfall * dt
        return (covered, share / covered, short / covered) if covered else (0.0, 0.0, 0.0)


def over_by(limit: float, seconds: float) -> float:
    """How far over its limit a claim's mean measured share over `seconds` must be to be far over:
    SIGMAS standard deviations of that many samples of a claim at its limit."""
    p = min(max(limit, 0.05), 0.95)
    return SIGMAS * math.sqrt(p * (1 - p) / (SAMPLES_PER_S * seconds))


def short_by(limit: float, seconds: float) -> float:
    """How short of their shares (together `limit`) a claim's wanting neighbours must be over `seconds`
    for its hold to be not enough: ESCALATE_SIGMAS standard deviations of their samples, and at
    least NEIGHBOUR_SHORT."""
    p = min(max(limit, 0.05), 0.95)
    return max(NEIGHBOUR_SHORT, ESCALATE_SIGMAS * math.sqrt(p * (1 - p) / (SAMPLES_PER_S * seconds)))


def suspected(g: ClaimGuard) -> tuple[float, bool] | None:
    """When the claim is far over its limit with a neighbour short over one of WINDOWS_S: the
    window's measured share, and whether its wanting neighbours' loss is established over it too
    (short_by); else None."""
    for seconds in WINDOWS_S:
        covered, share, short = g.window(seconds)
        if covered >= seconds * 0.9 and share > g.limit + over_by(g.limit, seconds) and short > NEIGHBOUR_SHORT:
            return share, short > short_by(g.wanting_limit, seconds)
    return None


HOLD, KILL, REPORT = "hold", "kill", "report"


def step(g: ClaimGuard, seconds: float, measured: float, shortfall: float) -> str | None:
    """One agent period of one claim's guard: HOLD when its hold starts now, KILL when it starts with
    its neighbours' loss established or its hold has not made them whole in ESCALATE_S (the caller
    acts only under --enforce=kill)."""
    g.clock += seconds
    now = g.clock
    g.periods.append((seconds, measured, shortfall))
    covered = sum(dt for dt, _, _ in g.periods)
    while covered > LONG_WINDOW_S + seconds:
        covered -= g.periods.popleft()[0]
    target = max(0.0, g.limit - HOLD_TARGET)
    if not g.held:
        found = suspected(g)
        if found is None:
            return None
        share, harmed = found
        g.held, g.average, g.run, g.acted_at = True, share, FIRST_RUN, now
        return KILL if harmed else HOLD
    g.average += (measured - g.average) * SMOOTHING
    # A stopped process's GPU work stays queued (a driver queues about a thousand launches), and a
    # process that runs refills it at once: its share falls only once its run part is short against
    # refilling, so the run part shrinks by factors while it is over its target and a neighbour is
    # short; else (it takes only idle time, or less than its share) it doubles each second.
    if g.average > target and g.window(CONTENDED_S)[2] > NEIGHBOUR_SHORT:
        g.run = max(MIN_RUN, g.run * math.exp(-RATE * (g.average - target) * seconds))
    else:
        g.run = min(1.0, g.run * 2 ** seconds)  # doubled each second
    if now - g.acted_at >= RELEASE_S and g.run >= 0.5 and g.window(RELEASE_S)[1] <= g.limit:
        g.held, g.periods = False, deque()  # within its share for RELEASE_S, barely stopped: let go
        return None
    # Its work queued while it ran still meets the neighbours' (a thousand launches of long kernels
    # are seconds of GPU time): a hold that leaves a neighbour short this long, while the claim
    # still takes more than its share, is not enough.
    _, share, short = g.window(ESCALATE_S)
    if now - g.acted_at >= ESCALATE_S and short > short_by(g.wanting_limit, ESCALATE_S) and share > g.limit:
        g.acted_at = now
        return KILL
    return None


@dataclass(frozen=True)
class Member:
    """A claim's share on one GPU as the agent measured it in the last period."""

    key: tuple[str, int]   # (claim uid, GPU index in the claim)
    limit: float           # 0..1
    measured: float        # NVML: the claim's processes' share of the GPU, 0..1
    wanting: bool          # its library held launches back (it wanted more GPU time than it ran)
    slot: tuple[int, int] = (0, 0)  # its slot: (period, start) us on CLOCK_MONOTONIC (shares.py; 0: none)


@dataclass
class Hold:
    """What the duty cycle's thread does to one held claim: run its processes from the start of its
    slot for `run` of the period, stop them for the rest."""

    pids: list[int]
    run: float
    period_s: float
    start_s: float
    stopped: bool = False
    since: float = 0.0  # when they were stopped


class Guard:
    """Every claim's guard, and the thread that stops and resumes held claims' processes."""

    def __init__(self, enforce: str = "kill",
                 on_action: Callable[[tuple[str, int], str, float, float], bool] | None = None,
                 record: str | None = None) -> None:
        """enforce: `kill` (holds and kills) or `report` (Events and metrics only, as the backstop);
        on_action(key, HOLD, KILL or REPORT, limit, measured): the agent's Event, and its kill; False when
        there was nothing to kill (its processes between two runs): it is tried again next period.
        record: a file (the plugin's state dir) naming the processes a hold may have stopped, so
        that the next agent resumes them if this one dies while they are stopped (None: none)."""
        self._record = record
        self.claims: dict[tuple[str, int], ClaimGuard] = {}
        self._enforce = enforce
        self._on_action = on_action
        self._recorded: list[int] = []  # the pids the record names
        self._lock = threading.Lock()
        self._holds: dict[tuple[str, int], Hold] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def observe(self, gpus: Iterable[list[Member]], seconds: float) -> None:
        """One agent period: each GPU's paced claims, as measured."""
        seen = set()
        for members in gpus:
            for m in members:
                seen.add(m.key)
                g = self.claims.setdefault(m.key, ClaimGuard(m.limit))
                g.limit, g.slot = m.limit, m.slot
                # its neighbours short of their shares, that wanted more: one that leaves time idle (a
                # request server) lends it to whoever fills it (docs/compute.md). Summed unclipped: the
                # samples' noise averages out over a window
                wanting = [o for o in members if o is not m and o.wanting]
                shortfall = sum(o.limit - o.measured for o in wanting)
                g.wanting_limit = sum(o.limit for o in wanting)
                starts = not g.held
                action = step(g, seconds, m.measured, shortfall)
                if action is None:
                    continue
                log.warning("claim far over its compute share while a neighbour is short", action=action,
                            claim=m.key[0], gpu=m.key[1], limit=round(m.limit * 100, 1),
                            measured=round(g.average * 100, 1), run=g.run, enforce=self._enforce)
                if self._enforce != "kill":  # told once, when its hold would start
                    if starts and self._on_action is not None:
                        self._on_action(m.key, REPORT, m.limit, g.average)
                    continue
                done = self._on_action(m.key, action, m.limit, g.average) if self._on_action else True
                if action == KILL:
                    if done:
                        g.kills += 1
                    else:  # nothing to kill this period (its processes between two runs): tried again next
                        g.acted_at -= ESCALATE_S
        for key in set(self.claims) - seen:
            del self.claims[key]

    def held(self) -> dict[tuple[str, int], float]:
        """Each held claim's part of its period its processes run (none under --enforce=report)."""
        if self._enforce != "kill":
            return {}
        return {k: g.run for k, g in self.claims.items() if g.held and g.run < 1.0}

    def enforce(self, units: dict[tuple[str, int], list[int]]) -> None:
        """The processes of each held claim (from the agent's process map: host pids); starts the
        duty cycle's thread at the first hold. A claim no longer held is resumed."""
        holds = self.held()
        with self._lock:
            old, self._holds = self._holds, {}
            for key, run in holds.items():
                period_us, start_us = self.claims[key].slot
                period_us = period_us or int(CYCLE_S * 1e6)
                h = old.pop(key, None) or Hold([], run, 0, 0)
                pids = units.get(key, [])
                if h.stopped:  # a process that left the claim's units (its GPU work ended) runs again
                    signal_pids(set(h.pids) - set(pids), signal.SIGCONT)
                h.pids, h.run, h.period_s, h.start_s = pids, run, period_us / 1e6, start_us / 1e6
                self._holds[key] = h
        for h in old.values():  # let go
            if h.stopped:
                signal_pids(h.pids, signal.SIGCONT)
        self._write_record()
        if holds and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="compute-guard", daemon=True)
            self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            holds, self._holds = self._holds, {}
        for h in holds.values():
            signal_pids(h.pids, signal.SIGCONT)
        self._write_record()

    def resume(self) -> None:
        """At the agent's start: what a previous agent that died holding claims left stopped runs again."""
        if self._record is not None:
            resume_recorded(self._record)

    def _write_record(self) -> None:
        """The held claims' processes, each with its start time (a pid reused since is not it);
        written when they change."""
        with self._lock:
            pids = sorted({pid for h in self._holds.values() for pid in h.pids})
        if self._record is None or pids == self._recorded:
            return
        try:
            if pids:
                write_atomic(self._record, json.dumps({str(p): start_time(p) for p in pids}).encode(), 0o600)
            else:
                remove_durable(self._record)
            self._recorded = pids
        except OSError as e:  # the holds go on; only a crash's resume is at stake
            log.error("cannot record the held processes", path=self._record, error=str(e))

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            wake = now + 0.05  # at the latest: new holds and units
            with self._lock:
                for key, h in self._holds.items():
                    phase = (now - h.start_s) % h.period_s
                    running = phase < h.run * h.period_s
                    if running and h.stopped:
                        signal_pids(h.pids, signal.SIGCONT)
                        h.stopped = False
                        g = self.claims.get(key)
                        if g is not None:
                            g.held_s += now - h.since
                    elif not running and not h.stopped:
                        stop_all(h.pids)
                        h.stopped, h.since = True, now
                    wake = min(wake, now + (h.run * h.period_s - phase if running else h.period_s - phase))
            self._wake.clear()
            self._wake.wait(max(0.0, wake - time.monotonic()))


def resume_recorded(record: str) -> None:
    """Resume (SIGCONT) the processes a previous agent's holds may have left stopped: those its
    record names that still have the start time it wrote."""
    try:
        with open(record) as f:
            named: dict[str, int | None] = json.load(f)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        log.error("cannot read the held processes of the last agent", path=record, error=str(e))
        return
    alive = [int(p) for p, started in named.items() if p.isdigit() and started is not None
             and start_time(int(p)) == started]
    signal_pids(alive, signal.SIGCONT)
    log.info("resumed the processes the last agent held", pids=alive)
    remove_durable(record)


def _state(pid: int) -> str | None:
    """The process's state letter (proc(5) stat field 3); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0].decode()
    except (OSError, IndexError):
        return None


def signal_pids(pids: Iterable[int], sig: int) -> None:
    """Signal each process by a pidfd, so a pid reused since it was listed is never signalled."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            signal.pidfd_send_signal(fd, sig)
        except OSError:
            pass
        finally:
            os.close(fd)


def stop_all(pids: list[int]) -> None:
    """SIGSTOP every process, in rounds until none runs: one resumed by another (SIGCONT) before
    that one was stopped is stopped again."""
    left = pids
    for _ in range(STOP_ROUNDS):
        signal_pids(left, signal.SIGSTOP)
        left = [p for p in left if _state(p) not in (None, "T", "t", "Z", "X")]
        if not left:
            return
        time.sleep(0.0005)  # (the signal is delivered on the process's next return to user space)


def container_pids(cgroup: str) -> list[int]:
    """Every process in the container's cgroup or below it (/proc/<pid>/cgroup text)."""
    held = cgroup_pidfds(cgroup)
    for fd in held.values():
        os.close(fd)
    return sorted(held)
