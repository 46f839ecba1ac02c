"""The fill relay: whether a GPU's Hard claims have work now, told to the Burst claim that fills
the GPU behind them within a few milliseconds (docs/compute.md, "The fill").

A Burst claim beside Hard claims that work in bursts cannot see their work on a time-sliced GPU
but by trying (each try costs the owner about a slice), and the agent's period (0.25-1 s) is far
longer than a burst. So a thread polls each Hard claim's charged GPU time (its region's
`pace_gpu_ns`, which its library adds to at every launch) and, when it moves, tells the Burst
claim's control file that the Hard claims have work until the end of the queue the launching
process predicts (`pace_qend_ns`) and a margin, at least OWNER_HOLD_NS after the launch (its next
launch may be a kernel away). The filling claim's library launches only after that. The thread
polls every RELAY_INTERVAL_NS while the Hard claims may be idle, and while they have work
until a poll before the time it told (a filler waits until then anyway).

Catching up (issue 39): on a GPU with no filling Burst claim, every busy claim of several that
are all paced is told the same of the GPU's other claims (its control file's
`owner_busy_until_ns`): outside its slot its library launches into their idle time
(docs/compute.md, "Framework-shaped work"). Its margin is CATCHUP_MARGIN_KERNELS of its own
kernels, so it fills only a gap longer than that: with one kernel, a 2.65 ms matmul claim filled
the 2.4 ms pauses of a batch-1 inference neighbour, whose requests then waited for it (p50 0.34 ->
0.62 ms); and at least OWNER_HOLD_NS (a fill costs the owner a context switch each way when its
work comes back). The others count as idle that margin after their last launch, or
REQUEST_HOLD_NS where one of them uses less than half of its share: a request server, whose
pauses between requests a fill would delay its next request into (a busy claim of 410 us kernels
filled the 2.4 ms pauses of a small-kernel client at 50: its p50 0.48 -> 1.31 ms).

The margin: a burst's first kernels wait behind the filler's kernel in flight, which the
owner's prediction does not know, so its work ends up to one of the filler's kernels later than
it says. Measured (hack/bench-share, 2.65 ms kernels, 2026-11-26) with margins of 0.5 ms / one /
two of the filler's kernels: a Hard 50 of bursts every 100 ms got 44.6 / 45.5 / 45.9 % beside a
Burst 50, the GPU 96.6 / 96.8 / 97.1 % busy; a steady Hard 70 arriving beside a Burst 30 got 66.3 / 67.4 / 64.4 %
(each period's margin idles the GPU; the Burst claim then held 100 % of its limit and took that
back from the Hard claim; it now holds 95 %, and the Hard 70 reads 68.8-69.8).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from .control import Control
from .regions import Region
from .shares import Share

RELAY_INTERVAL_NS = 2_000_000  # the poll while a Hard claim may be idle (a bare 2 ms sleep loop: 1.6 % of a core here)
RELAY_NAP_MAX_NS = 10_000_000  # the longest: the filler takes a relay unseen for 50 ms as gone (GS_RELAY_STALE_NS)
OWNER_HOLD_NS = 2_000_000     # after an owner's launch, at least
MARGIN_KERNELS = 1            # the owner's queue ends up to this many of the filler's kernels after it says
CATCHUP_MARGIN_KERNELS = 2    # a claim outside its slot fills only gaps of this many of its kernels (2 ms at least)
MARGIN_MIN_NS, MARGIN_MAX_NS = 500_000, 20_000_000  # the margin's bounds
REQUEST_HOLD_NS = 10_000_000  # ... a neighbour that serves requests, this long after its last launch
LIGHT_USE = 0.5               # (one that used less than this part of its share, averaged over the agent's periods)
QUEUE_SANE_NS = 20_000_000    # a queue end said further ahead is taken as this far (the library queues 10 ms)


class Relay:
    """A thread that relays the Hard claims' launches to the filling Burst claim of each GPU, or
    each claim's neighbours' to it (catching up), the pairs set by the agent's period (`watch`); it
    sleeps while there are none."""

    def __init__(self) -> None:
        self._pairs: list[tuple[tuple[Region, ...], Control, int, int]] = []
        # (id(region), id(control)) -> (pace_gpu_ns, busy until): a region is watched by each claim beside it
        self._seen: dict[tuple[int, int], tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()  # set while there is something to relay, or on stop
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="fill-relay", daemon=True)  # at the first pair

    def watch(self, pairs: Sequence[tuple[Sequence[Region], Control, int, int]]) -> None:
        """(the owners' regions, the filling claim's control, the margin and the hold in ns) for each
        filling claim of this period; controls no longer in it are told there is no relay."""
        with self._lock:
            kept = {id(c) for _, c, _, _ in pairs}
            for _, c, _, _ in self._pairs:
                if id(c) not in kept:
                    _tell(c, 0, 0)
            self._pairs = [(tuple(owners), c, margin, hold) for owners, c, margin, hold in pairs]
            live = {(id(r), id(c)) for owners, c, _, _ in self._pairs for r in owners}
            self._seen = {k: v for k, v in self._seen.items() if k in live}
            if self._pairs:
                if not self._thread.is_alive() and not self._stop:
                    self._thread.start()
                self._wake.set()
            else:
                self._wake.clear()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                if self._stop:
                    return
                now = time.monotonic_ns()
                naps = []
                for owners, control, margin, hold in self._pairs:
                    until = max((self._owner(r, control, now, margin, hold) for r in owners), default=0)
                    _tell(control, until, now)
                    naps.append(_nap_ns(until, now))
            time.sleep(min(naps, default=RELAY_INTERVAL_NS) / 1e9)

    def _owner(self, region: Region, control: Control, now: int, margin: int, hold: int) -> int:
        """Until when the claim of `region` has work, as told to `control`: at least `hold` after a
        launch (its next launch may be a kernel away), and `margin` after its queue's end."""
        key = (id(region), id(control))
        try:
            h = region.counters()
            last, until = self._seen.get(key, (h.charged_ns, 0))
            if h.charged_ns != last:
                until = max(now + hold, min(h.queue_end_ns, now + QUEUE_SANE_NS) + margin)
        except ValueError:  # closed by the agent (claim unprepared) before the next period's watch
            return 0
        self._seen[key] = (h.charged_ns, until)
        return until

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        self.watch([])


def fill_pairs(gpus: Sequence[tuple[str, Share, Region | None, Control | None]]
               ) -> list[tuple[list[Region], Control, int, int]]:
    """The relay's pairs from the (GPU UUID, share, region, control) of every claim on every GPU,
    as plan_gpu left the shares: for each GPU with a filling Burst claim, its Hard claims' regions,
    its control and the margin (MARGIN_KERNELS of its kernels; its kernel length is its own report,
    so a forged one only keeps itself waiting longer) and OWNER_HOLD_NS; for each claim that catches
    up, the GPU's other claims' regions, its control, CATCHUP_MARGIN_KERNELS of its kernels
    (OWNER_HOLD_NS at least) as its margin, and as its hold too, but REQUEST_HOLD_NS beside a
    neighbour that uses less than LIGHT_USE of its share."""
    owners: dict[str, list[Region]] = {}
    fillers: dict[str, tuple[Control, int]] = {}
    pairs: list[tuple[list[Region], Control, int, int]] = []
    for uuid, share, region, control in gpus:
        if share.fill and control is not None:
            fillers[uuid] = (control, _margin(share))
        elif not share.burst and region is not None:
            owners.setdefault(uuid, []).append(region)
    for uuid, share, _, control in gpus:  # each claim outside its slot: the GPU's other claims
        if share.catchup and control is not None:
            others = [(s, r) for u, s, r, _ in gpus if u == uuid and s is not share and r is not None]
            margin = max(OWNER_HOLD_NS, _margin(share, CATCHUP_MARGIN_KERNELS))
            # a neighbour that uses less than half of its share serves requests: its pauses between them
            # are not to be filled (each fill delays its next request by the filler's kernel and a switch)
            hold = max([margin] + [REQUEST_HOLD_NS for s, _ in others if s.used < LIGHT_USE * s.limit])
            pairs.append(([r for _, r in others], control, margin, hold))
    fills = [(owners.get(uuid, []), control, margin, OWNER_HOLD_NS) for uuid, (control, margin) in fillers.items()]
    return fills + pairs


def _margin(share: Share, kernels: int = MARGIN_KERNELS) -> int:
    """`kernels` of the claim's kernels (its own report: a forged one keeps itself waiting)"""
    return min(MARGIN_MAX_NS, max(MARGIN_MIN_NS, kernels * share.kernel_us * 1000))


def _nap_ns(until: int, now: int) -> int:
    """How long the relay may sleep, having told a filling claim that its Hard claims have work
    until `until`: the filler waits that long anyway, so a launch that says more work need only be
    seen a poll before then; once they may have no work, a new burst must be seen within a poll."""
    return max(RELAY_INTERVAL_NS, min(RELAY_NAP_MAX_NS, until - now - RELAY_INTERVAL_NS))


def _tell(control: Control, until: int, now: int) -> None:
    try:
        control.relay(until, now)
    except ValueError:  # closed by the agent (claim unprepared)
        pass
