"""CPUs kept awake while the simulated GPU serves latency measurements (tests, hack/bench-share).

A real driver's synchronize spins on the completion (cudaDeviceScheduleAuto, with fewer contexts
than CPUs), so the CPU of a client waiting for its request never halts. The simulated driver
(hook/sim) sleeps instead, and a halted CPU of a virtual machine wakes a sleeper 0.3-3 ms late now
and then: an inference client's p99 beside a busy context read 3.7-3.9 ms with idle CPUs and
2.76-2.78 ms with them awake (2026-11-26, three runs each; docs/compute.md).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

# one per CPU at idle priority (SCHED_IDLE): it runs only when nothing else wants the CPU
_SPINNER = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass\n"


@contextlib.contextmanager
def cpus_awake() -> Iterator[None]:
    """Keep every CPU from halting while the block runs, as a spinning driver does. The spinners
    take no time from the processes measured: an idle-priority process gives way at once."""
    spinners = [subprocess.Popen([sys.executable, "-c", _SPINNER]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


@contextlib.contextmanager
def measured_first() -> Iterator[None]:
    """The processes started in the block (they inherit it) ahead of the machine's other work, at
    a real-time priority (SCHED_RR): on a loaded machine another process's turn on the CPU delays
    a client's wake-up or a launch, which the model does not have, so a measurement would read the
    load instead of the model. They sleep between requests and launches (the kernel caps real-time
    tasks at 95 % of a CPU anyway). As root only; the caller's own policy comes back after."""
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(10))
    except PermissionError:
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, before[0], before[1])
