"""Time slots: how the claims on one GPU take turns (the library's side: hook/src/pacing.c;
the design and its figures: docs/compute.md).

Contexts of different processes are time-sliced by the GPU, so a claim's event-timed launch
cost counts the other claims' slices, and NVML's per-process utilization is sampled (a busy
process can be missing from a whole period): neither can hold a share to a few points. Instead
the agent lays the claims of a GPU out as consecutive slots of one period (PERIOD_US), each its
compute limit's part of it, and writes each claim's slot and rate into its trusted control
file. The library lets a claim that is using its whole share launch a period's worth inside
its slot, so busy claims run one at a time, each measuring its own cost; a claim using less
than its share launches at once, wherever it is.

`Burst`: a busy Burst claim's slot also covers what follows it up to the next busy claim's
slot (idle claims' slots, time no claim holds), with the rate to match; the agent sees a claim
busy from the GPU time its library charged in the last period (the region: a claim can only
claim to be busier than it is, which costs the Burst neighbours their borrowed time, never the
claim's own share). So borrowed time is handed back at the first period in which the owner is
busy again. Burst claims are laid out last, so the unallocated rest of the period follows them.

The lent span: a busy Hard claim that charges less GPU time than its slot holds (a bursty one)
leaves the slot's tail idle, and the busy Burst claim whose slot follows is lent that tail, less
a margin (`lent_us`, right before its slot), where its library launches only while the GPU runs
no other work and gives the span up at the first sign of the owner's. A tenant that forges its
charged time higher lends nothing (it takes borrowed time from its Burst neighbour only); one
that forges it lower lets the neighbour try more of its own slot, which costs only itself.

Long kernels: a slot holds whole kernels (the library drains a claim's work before its slot ends),
so a claim loses what its slot has left after its last whole kernel: a Hard 10 claim of 12 ms
kernels got one per 20 ms slot, 6.5 %. So the period of a time-sliced GPU is the shortest, in
steps of PERIOD_US up to MAX_PERIOD_US, in which no busy claim's slot loses more than
MAX_SLOT_LOSS of the GPU that way, reckoned with its longest launch (its library's
`pace_kernel_us`). Every change of the period moves every slot of the GPU (the claims' queued work
then meets: three tenants of 2.65 ms kernels lost 2-6 points while the first, inflated cost samples
moved it), so it changes only on lengths each claim reported several times. A tenant that forges a
longer kernel stretches the period for every claim of its GPU: their slots come further apart
(latency, the Burst hand-back), their rates and so their shares stay.
"""

from __future__ import annotations

from dataclasses import dataclass

PPM = 1_000_000
PERIOD_US = 200_000       # the slot period (docs/compute.md, "The slot handover": long against a kernel)
MPS_PERIOD_US = 20_000    # a GPU of MPS claims only: the server holds each client to its SMs, no
                          # handover to drain; at 200 ms four processes of a 25 % claim read 20-31 %
BUSY = 0.01               # a claim that used at least 1 % of the GPU last period is busy
LEND_MARGIN_US = 20_000   # lent: the idle tail of a Hard slot, after the owner's GPU time and this
USED_WEIGHT = 0.25        # the weight of the last period in Share.used
MAX_SLOT_LOSS = 0.01      # of the GPU, after a busy claim's last whole kernel in its slot
MAX_PERIOD_US = 1_000_000 # no longer than the node agent's default interval (1 s), in which a claim
                          # that works once a period is seen busy; the share agent looks back a period
SWITCH_US = 300           # each slot's first launch books a context switch (hook/src/pacing.c SWITCH_NS)
KERNEL_REPORTS = 4        # a claim's kernel length: the shortest of its last reports of its longest launch


@dataclass(eq=False)
class Share:
    """Controller state of one (claim, GPU)."""

    limit: float            # the claim's share, 0..1
    burst: bool
    trusted: bool = False   # it has a control file: it gets a slot and may exceed the limit (Burst)
    rate: float = 0.0       # the rate written last period, 0..1 (0: not written yet)
    measured: float = 0.0   # NVML's share in the last period (sampled: for metrics), 0..1
    charged: float = 0.0    # GPU time its library charged in the last period, 0..1
    used: float = -1.0      # charged, averaged over the last periods (plan_gpu; -1: none yet)
    paced: bool = False     # the library slept launches of the claim in the last period
    start_us: int = 0       # its slot in the period
    length_us: int = 0
    period_us: int = PERIOD_US  # the period its GPU's slots repeat in (plan_gpu)
    lent_us: int = 0        # a busy Burst claim's lent span right before its slot (plan_gpu)
    fill: bool = False      # a Burst claim that fills the GPU behind its Hard claims (plan_gpu; relay.py)
    catchup: bool = False   # told by the relay when the GPU's other claims have work (plan_gpu; relay.py)
    unpaced: bool = False   # contexts nobody paces share its GPU: no slot handover (the agent)
    procs: int = 0          # its processes on the GPU as the agent counts them (NVML, mapped from kernel
                            # facts; 0: none seen or not known): the control file's `procs`
    kernel_us: int = 0      # its longest launch of late (the library's pace_kernel_us; count)
    _kernel_reports: tuple[int, ...] = ()  # the last KERNEL_REPORTS non-zero ones, newest first
    charged_max: float = 0.0  # the most it charged in one of the agent's periods within its slot period
    _recent: tuple[tuple[float, float], ...] = ()  # (seconds, charged) of those agent periods

    @property
    def busy(self) -> bool:
        return max(self.charged, self.charged_max, self.measured) >= BUSY

    def count(self, charged_ns: int, seconds: float, kernel_us: int) -> None:
        """One agent period's report of the claim's library: the GPU time it charged in the period
        of `seconds` (its region's pace_gpu_ns less the last report's) and its longest launch since
        the last report (0: it launched nothing). A claim whose slot period is longer than the
        agent's is busy in only some of its periods: it counts as busy while it was in any of the
        last slot period's. Its kernel length is the shortest of its last KERNEL_REPORTS reports
        (before that many, none)."""
        self.charged = charged = max(0, charged_ns) / 1e9 / seconds if seconds > 0 else 0.0
        recent, covered = [(seconds, charged)], seconds
        for old in self._recent:
            if covered >= self.period_us / 1e6:
                break
            recent.append(old)
            covered += old[0]
        self._recent = tuple(recent)
        self.charged_max = max(c for _, c in recent)
        if kernel_us:  # the first cost samples of a claim beside busy ones count their slices
            # (6-9 ms for a 2.65 ms kernel, for about a second): a length counts once reported
            # KERNEL_REPORTS times
            self._kernel_reports = (kernel_us, *self._kernel_reports[:KERNEL_REPORTS - 1])
            self.kernel_us = min(self._kernel_reports) if len(self._kernel_reports) == KERNEL_REPORTS else 0


def slot_loss(slot_us: float, kernel_us: int) -> float:
    """What a slot of slot_us leaves after its switch and its last whole kernel_us kernel, in us. A
    slot shorter than one kernel loses nothing so: its first launch always goes, and the claim's
    timeline spaces its kernels over periods."""
    room = slot_us - SWITCH_US
    return room % kernel_us if room >= kernel_us else 0.0


def kernel_loss(s: Share) -> float:
    """The part of the GPU a busy claim's slot loses each period after its last whole kernel
    (slot_loss over the period); 0 for an idle claim, a length not known yet, or a slot that
    covers the period."""
    if not (s.busy and s.kernel_us) or s.length_us >= s.period_us:
        return 0.0
    return slot_loss(s.length_us, s.kernel_us) / s.period_us


def plan_gpu(shares: list[Share], mps_only: bool = False) -> float:
    """Lay out the slots of the claims on one GPU (Hard ones first, in the given order) and set
    each claim's rate: its limit, or for a busy Burst claim its slot's part of the period. A busy
    claim's slot covers what follows it up to the next busy claim's slot (idle claims' slots, time
    no claim holds): a Hard claim keeps its rate, so it launches its share at the start of the
    slot as before, but its work may end later without waiting for another period (the library
    stops a slot's work before the slot ends: a kernel that does not fit waits for the next slot),
    and a claim alone on the GPU has the whole period, with no context switch to leave room for.

    The fill: where one Burst claim (of one process) shares a time-sliced GPU with Hard claims only,
    every context paced, the Hard claims' slots are laid out alone and the Burst claim fills behind
    them (`fill`, `lent_us` = the period, its rate its limit): its library launches whenever the
    agent's relay says no Hard claim has work (relay.py; docs/compute.md, "The fill").

    Catching up: elsewhere, on a time-sliced GPU of several claims, every context paced, each busy
    claim is told by the relay when the others have work (`catchup`): outside its slot its library
    then launches into their idle time, up to its share (docs/compute.md, "Framework-shaped work").

    The period: MPS_PERIOD_US where every paced claim is an MPS client (`mps_only`); else the
    shortest multiple of PERIOD_US, at most MAX_PERIOD_US, in which no busy claim's slot shorter
    than the period loses more than MAX_SLOT_LOSS of it after its last whole kernel.

    Returns the claims' limits together (1.0 = the whole GPU). Above 1 the GPU is oversubscribed
    (claims prepared past the allocator, e.g. by hand): every claim then gets its limit divided by
    that sum, in slot and rate, rather than the last ones a slot of no length; the caller reports it."""
    ordered = [s for s in shares if not s.burst] + [s for s in shares if s.burst]
    total = sum(s.limit for s in ordered)
    scale = 1.0 / total if total > 1.0 + 1e-9 else 1.0
    for s in ordered:  # a bursty claim's charged time swings with how many bursts fell in one period
        s.used = s.charged if s.used < 0 else s.used + (s.charged - s.used) * USED_WEIGHT
    for s in ordered:
        s.fill = s.catchup = False
    if mps_only:
        _layout(ordered, scale, MPS_PERIOD_US)
        return total
    bursts = [s for s in ordered if s.burst]
    fill = len(bursts) == 1 and bursts[0].procs <= 1 and len(ordered) > 1 and not any(s.unpaced for s in ordered)
    slotted = [s for s in ordered if not s.burst] if fill else ordered
    for period in range(PERIOD_US, MAX_PERIOD_US + 1, PERIOD_US):
        _layout(slotted, scale, period)
        if all(kernel_loss(s) <= MAX_SLOT_LOSS for s in slotted):
            break  # else at MAX_PERIOD_US the agent says so in the claim's status (kernels_too_long)
    if not fill and len(ordered) > 1 and not any(s.unpaced for s in ordered):
        for s in ordered:  # outside its slot a busy claim fills the others' idle time (relay.py): an idle
            s.catchup = s.busy  # one needs no relay, whose polls cost a node of idle claims 1.6-2.7 % of a core
    if fill:  # the Burst claim fills behind the Hard claims' slots, which cover the period between them
        b = bursts[0]
        b.fill, b.rate, b.period_us = True, b.limit * scale, period
        b.start_us, b.length_us, b.lent_us = 0, max(1, round(b.limit * scale * period)), period
    return total


def _layout(ordered: list[Share], scale: float, period_us: int) -> None:
    """plan_gpu's slots, rates and lent spans in a period of period_us."""
    start = 0
    for s in ordered:
        s.start_us, s.length_us = start, min(period_us - start, round(s.limit * scale * period_us))
        start += s.length_us
    busy = [s for s in ordered if s.busy]
    for s in ordered:
        s.rate = s.limit * scale
        s.period_us = period_us
        if s.busy:
            later = [o.start_us for o in busy if o.start_us > s.start_us]
            end = later[0] if later else busy[0].start_us + period_us  # cyclic: s itself at the latest
            s.length_us = min(period_us, end - s.start_us)
            if s.burst:
                s.rate = s.length_us / period_us
    for s in ordered:  # lent: the idle tail of the busy Hard slot right before a busy Burst claim's
        s.lent_us = 0
        if s.burst and s.busy and len(busy) > 1:
            before = busy[busy.index(s) - 1]  # cyclic: its slot ends where s's begins
            if not before.burst:
                idle = before.length_us - round(max(before.used, before.charged) * period_us) - LEND_MARGIN_US
                s.lent_us = max(0, min(idle, before.length_us))


def to_ppm(rate: float) -> int:
    return int(round(rate * PPM))
