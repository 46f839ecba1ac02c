"""ClaimView: what the agent knows of one prepared claim on this node, shared by its parts
(the planner, the backstop, the MPS watch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dra_driver.config import TIME_SLICING
from kubeletplugin.prepared import PreparedGpu

from .control import Control
from .regions import EMPTY, Region
from .shares import Share, to_ppm


@dataclass
class ClaimView:
    uid: str
    namespace: str
    name: str
    gpus: tuple[PreparedGpu, ...]
    limits_path: str
    regions: list[Region | None]
    controls: list[Control | None]        # None: no control file (older plugin), rate goes to the region
    shares: list[Share]
    process_memory: list[dict[int, int]] = field(default_factory=list)  # per GPU: pid -> NVML bytes
    paced_ns: list[int] = field(default_factory=list)                  # per GPU: the region's, last period
    pods: dict[str, str] = field(default_factory=dict)  # status.reservedFor: pod UID -> name
    charged_ns: list[int] = field(default_factory=list)                # per GPU: the region's, last period
    sharing_strategy: str = TIME_SLICING  # None: no region or control file, the backstop only

    def apply(self, i: int) -> None:
        """Write GPU i's plan into its control file (a slot only where no tenant can write it), with
        the count of the claim's processes on it (the library's answer to a forged region); without
        a control file, only the rate, into the region."""
        s, control, region = self.shares[i], self.controls[i], self.regions[i]
        if control is None:
            if region is not None:
                region.rate_ppm = to_ppm(s.rate)
            return
        control.plan(s)

    def count_period(self, seconds: float) -> None:
        """Each share's charged GPU time, longest launch and paced flag over the last period, from
        the regions."""
        counters = [r.counters() if r else EMPTY for r in self.regions]
        for r, h in zip(self.regions, counters, strict=True):
            if r is not None and h.kernel_us:
                r.clear_kernel_us()
        paced_ns = [h.paced_ns for h in counters]
        charged_ns = [h.charged_ns for h in counters]
        kernel_us = [h.kernel_us for h in counters]
        for s, now, before, c_now, c_before, k in zip(self.shares, paced_ns, self.paced_ns or paced_ns, charged_ns,
                                                      self.charged_ns or charged_ns, kernel_us, strict=True):
            s.measured = 0.0
            s.paced = now > before
            s.count(c_now - c_before, seconds, k)
        self.paced_ns, self.charged_ns = paced_ns, charged_ns

    def close(self) -> None:
        for f in (*self.regions, *self.controls):
            if f is not None:
                f.close()
