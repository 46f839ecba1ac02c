"""What the tests share besides fixtures: helpers and constants, one place for each.

Test modules import helpers from here (and claim builders from playground.claims)
and get fixtures from the conftest.py files; they never import another test module or a
conftest (tests/repo/test_layout.py checks it). No product code imports this package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "hook" / "build"  # `make hook`: libgpushare.so, the simulated driver (sim/), the probes
GiB = 1 << 30
MiB = 1 << 20

# For tests that measure a compute share from wall-clock launches. On a shared 2-core CI machine
# a CPU stall of the launching process can push one run past its bound, so such a test runs
# again, at most twice (pytest-rerunfailures; the summary line counts reruns). A broken pacing
# design misses in every run (the one before agent slots gave a 30 % claim 21 %).
CPU_TIMED = pytest.mark.flaky(reruns=2, reruns_delay=1)

# Serial files that run their measured processes at real-time priority (playground.simcpu
# measured_first): on 2 cores those starve a timed test beside them, so `make test` runs them
# after the other serial files, one at a time (marked `alone` by tests/conftest.py;
# tests/repo/test_layout.py finds every user).
ALONE = ("tests/hook/test_sim_calibration.py", "tests/agent/test_framework_shares.py")



def podman_busybox_why_not() -> str | None:
    """Why a test cannot run the probe in a podman container on a busybox root it builds
    (PodmanRunner(probe)): not root, podman or runc missing, busybox missing; None when it can."""
    from playground.containers import PodmanRunner

    if os.geteuid() != 0:
        return "needs root"
    if why := PodmanRunner.available():
        return why
    return "needs busybox (apt-get install -y busybox)" if shutil.which("busybox") is None else None


T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 10.0, interval: float = 0.1, what: str = "") -> T:
    """Poll until check() is truthy and return its value; fail naming `what` and the last value on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            assert value, f"timed out after {timeout} s waiting{' for ' + what if what else ''}; last value {value!r}"
            return value
        time.sleep(interval)


def wait_exec(*procs: subprocess.Popen[bytes], program: str) -> None:
    """Wait until each child runs `program` with its own environment: before its exec,
    /proc/<pid>/environ and cgroup are still the forked test's, and for a moment after
    /proc/<pid>/exe names the new program, environ reads empty (the kernel sets it up later in the
    exec), so a check on them would pass or fail by luck."""

    def ready(p: subprocess.Popen[bytes]) -> bool:
        try:  # exe first: environ opened before the exec would read the old memory
            if not os.readlink(f"/proc/{p.pid}/exe").endswith("/" + program):
                return False
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                return bool(f.read())
        except OSError:
            return False

    wait_for(lambda: all(ready(p) for p in procs))
