"""Rate control: hold each claim's measured GPU share to its compute limit.

The library paces launches with a token bucket whose refill rate is the claim's share of GPU
time, charged at the launch cost it measures itself. That estimate can be off (queueing behind
other claims, kernels of varying size), so the agent closes the loop with what NVML measured:

    gain = measured share / rate in effect   (learned only while the claim uses its rate)
    rate = wanted share / gain               (clamped)

which converges in one or two periods when the gain is steady. Under `Hard` the rate may go
above the limit (at most HARD_BOOST times it) only where the agent writes it into the claim's
control file, which no tenant can write: that is what gives back the share an overcharged cost
(queueing behind another claim's kernels) takes away. Through the tenant-writable region the
library caps it at the limit. An idle claim's gain decays back to 1, so a claim that starts
again starts at its limit, never at a boost learned under old contention.

Under `Burst` the wanted share is the limit plus the GPU's idle time (split among the busy Burst claims on that GPU); as soon
as another claim becomes busy, its share is reserved again in the next period, so borrowed
time is handed back within one sampling period.
"""

from __future__ import annotations

from dataclasses import dataclass

PPM = 1_000_000
MIN_RATE = 0.005          # never stall a claim completely
GAIN_MIN, GAIN_MAX = 0.25, 4.0
GAIN_STEP = 0.5           # weight of the last period in the learned gain
BUSY = 0.01               # a claim using at least 1 % of the GPU needs its share
SATURATED = 0.5           # measured >= this fraction of the rate: the claim is limited by pacing
                          # (or the library reports it slept launches: `paced`)
HARD_BOOST = 3.0          # a Hard claim's rate (control file) stays <= this many times its limit


@dataclass(eq=False)
class Share:
    """Controller state of one (claim, GPU)."""

    limit: float            # the claim's share, 0..1
    burst: bool
    trusted: bool = False   # the rate goes to the control file: Hard may exceed the limit
    rate: float = 0.0       # the rate written last period, 0..1 (0: not written yet)
    gain: float = 1.0
    measured: float = 0.0   # share measured in the last period, 0..1
    paced: bool = False     # the library slept launches of the claim in the last period
    wanted: float = 0.0

    @property
    def busy(self) -> bool:
        return self.measured >= BUSY


def control_gpu(shares: list[Share], other_busy: float) -> None:
    """One period for the claims sharing a GPU. `measured` must be set; `other_busy` is GPU time
    of processes that belong to no claim. Sets `rate` (and `gain`, `wanted`)."""
    for s in shares:
        in_effect = s.rate or s.limit
        # Learn only from a claim its pacing holds back (else a claim using less than its rate
        # would wind the rate up). Queueing behind other claims can hold a paced claim well
        # below half its rate: the library's paced time says it is still pacing-limited.
        if s.measured >= SATURATED * in_effect or (s.paced and s.busy):
            s.gain = min(GAIN_MAX, max(GAIN_MIN, (1 - GAIN_STEP) * s.gain + GAIN_STEP * s.measured / in_effect))
        elif not s.busy:  # idle: no measurement to learn from, no wind-up; back toward the limit
            s.gain = 0.5 * s.gain + 0.5
    bursting = [s for s in shares if s.burst and s.busy]
    reserved = sum(s.limit for s in shares if s.busy or s.burst) + other_busy
    spare = max(0.0, 1.0 - reserved) / len(bursting) if bursting else 0.0
    for s in shares:
        s.wanted = s.limit + (spare if s.burst and s.busy else 0.0)
        # Sharing a busy GPU, a Burst claim's shortfall is contention, not a cost error: no boost.
        contended = other_busy >= BUSY or any(o.busy for o in shares if o is not s)
        if s.burst:
            cap = s.wanted if contended else 1.0
        else:
            cap = min(1.0, HARD_BOOST * s.limit) if s.trusted else s.limit
        s.rate = min(cap, max(MIN_RATE, s.wanted / s.gain))


def to_ppm(rate: float) -> int:
    return int(round(rate * PPM))
