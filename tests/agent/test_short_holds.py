"""Short holds over the limit, timed to the backstop's polls (issue 26, attack 4).

The backstop polled NVML on a fixed 50 ms schedule. A tenant that learnt its phase (the moment a
sacrificial container of its own was killed tells it; here the test reads it off the backstop)
could allocate past its claim in every gap between two polls, free before the next one, and
never be seen. The backstop now polls at a random instant of each period (backstop.poll_times),
so each hold of h ms is seen with a chance of h / 50 whenever it is made: the expected
memory-time over the limit before the kill is at most excess x 50 ms, however the holds are timed.

The tenant is a host process of the claim (ProcessRunner) with LD_PRELOAD unset, calling the
simulated driver through ctypes: 512 MiB in a 256 MiB claim, held HOLD_S in the middle of the
gap after each expected poll.
"""

from __future__ import annotations

import statistics
import sys
import textwrap
import time

from tests.support import wait_for

HOLD_S = 0.02
HOLDS = 60  # seen with a chance of 0.4 each: surviving all of them is a chance of 0.6^60 = 5e-14
EXCESS_GIB = 0.25  # 512 MiB held in a 256 MiB claim

TENANT = textwrap.dedent("""
    import ctypes, random, sys, time
    phase, period, hold, holds = (float(a) for a in sys.argv[1:5])
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, dev, ptr = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_uint64()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
    print("ready", flush=True)
    for i in range(int(holds)):
        now = time.monotonic()
        if phase < 0:  # no phase known: at a random time
            start = now + random.uniform(0, period)
        else:
            k = int((now - phase) / period) + 1
            start = phase + k * period + (period - hold) / 2  # the middle of the gap between two polls
        time.sleep(max(0.0, start - time.monotonic()))
        assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(512 << 20)) == 0
        time.sleep(hold)
        cuda.cuMemFree_v2(ptr)
        print(f"hold={i + 1}", flush=True)
    print("survived", flush=True)
""")


def poll_phase(backstop, polls: int = 30) -> tuple[float, list[float]]:
    """The phase (time.monotonic modulo the interval) of the backstop's polls, as a tenant would
    learn it, and the polls' offsets from it."""
    seen: list[float] = []
    real = backstop.poll
    backstop.poll = lambda agent: (seen.append(time.monotonic()), real(agent))[1]
    try:
        wait_for(lambda: len(seen) >= polls, timeout=30)
    finally:
        del backstop.poll  # the class's method again
    period = backstop.interval
    phase = statistics.median(t % period for t in seen)
    return phase, [((t - phase + period / 2) % period) - period / 2 for t in seen]


def test_holds_timed_between_the_polls_are_caught(node, tmp_path):
    ref, ids = node.claim(memory="256Mi")
    backstop = node.plugin.agent.backstop
    phase, offsets = poll_phase(backstop)
    script = tmp_path / "tenant.py"
    script.write_text(TENANT)
    w = node.runner.start_command("timed", ids, ["/usr/bin/env", "-u", "LD_PRELOAD", sys.executable, str(script),
                                                 str(phase), str(backstop.interval), str(HOLD_S), str(HOLDS)])
    node.workloads.append(w)
    w.read_until("ready", timeout=30)
    lines = w.wait(timeout=60)
    holds = sum(line.startswith("hold=") for line in lines)
    spread = max(offsets) - min(offsets)
    print(f"timed holds of {HOLD_S * 1000:.0f} ms between polls: killed after {holds} hold(s), "
          f"{holds * HOLD_S * EXCESS_GIB:.4f} GiB*s over the limit (expected at most "
          f"{EXCESS_GIB * backstop.interval:.4f}); learnt poll offsets spread over {spread * 1000:.1f} ms")
    assert "survived" not in lines, (lines, offsets)
    assert w.proc.returncode == -9, w.proc.returncode
    wait_for(lambda: (node.claim_metric("gpushare_claim_backstop_kills_total", ref) or 0) >= 1)


def test_what_short_holds_take_before_the_kill_is_bounded(node, tmp_path):
    """The bound, measured: RUNS tenants each holding 512 MiB in a 256 MiB claim for 10 ms at random
    times until killed. Expected memory-time over the limit before the kill: at most
    excess x interval (0.25 GiB x 50 ms = 0.0125 GiB*s); the mean of the runs is printed beside it
    and held to twice it (a mean of 8 draws of a geometric count)."""
    runs, hold = 8, 0.01
    ref, ids = node.claim(memory="256Mi")
    interval = node.plugin.agent.backstop.interval
    script = tmp_path / "tenant.py"
    script.write_text(TENANT)
    taken = []
    for run in range(runs):
        w = node.runner.start_command(f"random{run}", ids, ["/usr/bin/env", "-u", "LD_PRELOAD", sys.executable,
                                                            str(script), "-1", str(interval), str(hold), "1000"])
        node.workloads.append(w)
        w.read_until("ready", timeout=30)
        lines = w.wait(timeout=120)
        assert w.proc.returncode == -9 and "survived" not in lines, (w.proc.returncode, lines[-3:])
        # the hold being made when the kill came is not printed: count it
        taken.append((sum(line.startswith("hold=") for line in lines) + 1) * hold * EXCESS_GIB)
    bound = EXCESS_GIB * interval
    mean = statistics.mean(taken)
    print(f"short holds of {hold * 1000:.0f} ms at random times, {runs} runs: GiB*s over the limit before the kill "
          f"mean {mean:.4f}, max {max(taken):.4f} (bound on the expectation {bound:.4f})")
    assert mean <= 2 * bound, taken
