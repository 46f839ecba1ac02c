"""Fault points for crash tests (test-only; never set this in production).

With GPUSHARE_FAULT_POINT=<step> in its environment, the plugin SIGKILLs itself when it
reaches that step of Prepare or Unprepare, as a power cut or OOM kill would. The steps:
"""

from __future__ import annotations

import os
import signal

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


def reached(step: str) -> None:
    if os.environ.get(ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)
