"""Fault points of Prepare and Unprepare, for the crash and isolation tests: a Faults object the
Driver is given, NO_FAULTS (nothing happens) unless the plugin's process was started with one.
The driver's steps name their point with `@reaches(step)` (the step's method reaches it when it
returns); the MIG strategy is handed `Faults.reached` for its own two.

`gpushare-dra kubelet-plugin` reads them from its environment once, at start-up
(`Faults.from_env`; never set these in production):
GPUSHARE_FAULT_POINT=<step>: the plugin SIGKILLs itself when it reaches that step of Prepare
or Unprepare, as a power cut or OOM kill would.
GPUSHARE_FAULT_DELAY=<claim name>=<seconds>: Prepare of claims of that name sleeps that long
before reading the claim, holding the claim's lock, as a hung API server would.
The steps:
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Concatenate, ParamSpec, Protocol, TypeVar

PREPARE_STEPS = (
    "prepare-started-recorded",   # checkpoint says PrepareStarted, no files yet
    "prepare-files-written",      # limits, regions, ld.so.preload written
    "prepare-spec-written",       # CDI spec written
    "prepare-completed-recorded", # checkpoint says PrepareCompleted, answer not sent
)
UNPREPARE_STEPS = (
    "unprepare-started-recorded", # checkpoint says UnprepareStarted
    "unprepare-spec-removed",     # CDI spec gone
    "unprepare-files-removed",    # claim folder gone, checkpoint entry still there
    "unprepare-completed",        # checkpoint entry gone, answer not sent
)
# a claim of MIG devices only (docs/mig.md), between prepare-started-recorded and prepare-files-written
MIG_PREPARE_STEPS = (
    "prepare-mig-recorded",       # the MIG ledger says "creating", no instance yet
    "prepare-mig-created",        # the instance exists, the ledger still says "creating"
)
STEPS = PREPARE_STEPS + MIG_PREPARE_STEPS + UNPREPARE_STEPS
ENV = "GPUSHARE_FAULT_POINT"
DELAY_ENV = "GPUSHARE_FAULT_DELAY"


@dataclass(frozen=True)
class Faults:
    kill_at: str | None = None                 # a step of STEPS
    delay: tuple[str, float] | None = None     # (claim name, seconds)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Faults:
        name, _, seconds = env.get(DELAY_ENV, "").rpartition("=")
        return cls(env.get(ENV) or None, (name, float(seconds)) if name else None)

    def reached(self, step: str) -> None:
        if step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def delay_prepare(self, claim_name: str) -> None:
        if self.delay and self.delay[0] == claim_name:
            time.sleep(self.delay[1])


NO_FAULTS = Faults()


class _HasFaults(Protocol):
    faults: Faults


_S = TypeVar("_S", bound=_HasFaults)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def reaches(step: str) -> Callable[[Callable[Concatenate[_S, _P], _R]], Callable[Concatenate[_S, _P], _R]]:
    """A method that reaches fault point `step` of its object's `faults` when it returns."""
    if step not in STEPS:
        raise ValueError(f"fault point {step!r}: not one of {', '.join(STEPS)}")

    def decorate(method: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
        @wraps(method)
        def run(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            result = method(self, *args, **kwargs)
            self.faults.reached(step)
            return result
        return run
    return decorate
