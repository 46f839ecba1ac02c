"""Fault points for crash and isolation tests (test-only; never set these in production).

With GPUSHARE_FAULT_POINT=<step> in its environment, the plugin SIGKILLs itself when it
reaches that step of Prepare or Unprepare, as a power cut or OOM kill would.
With GPUSHARE_FAULT_DELAY=<claim name>=<seconds>, Prepare of claims of that name sleeps that
long before reading the claim, holding the claim's lock, as a hung API server would.
The steps:
"""

from __future__ import annotations

import os
import signal
import time

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
STEPS = PREPARE_STEPS + UNPREPARE_STEPS
ENV = "GPUSHARE_FAULT_POINT"
DELAY_ENV = "GPUSHARE_FAULT_DELAY"


def reached(step: str) -> None:
    if os.environ.get(ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def delay(claim_name: str) -> None:
    name, _, seconds = os.environ.get(DELAY_ENV, "").rpartition("=")
    if name and name == claim_name:
        time.sleep(float(seconds))
