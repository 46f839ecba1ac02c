"""Processes and threads sharing one claim: atomic reservations, dead processes, killed lock holders."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support import MiB
from tests.support.hook import kv

LIMIT = 64 * MiB
# the library built with its test-only fault hooks (hook/Makefile, TEST_FAULTS); never shipped
FAULTS_LIBRARY = "tests/libgpushare-faults.so"


@pytest.mark.parametrize("procs,rounds", [(2, 200), (16, 40)])
def test_processes_race_never_exceed_limit(make_claim, procs, rounds):
    # chunks that do not divide the limit evenly across processes make the last bytes contested
    c = make_claim(memory=LIMIT)
    p = c.run("tests/t_race", procs, rounds, LIMIT, 3 * MiB, timeout=120)
    assert "OK t_race" in p.stdout, p.stdout


def test_32_threads(make_claim):
    c = make_claim(memory=LIMIT)
    p = c.run("tests/t_threads", LIMIT, MiB, 30, timeout=120)
    assert "OK t_threads" in p.stdout, p.stdout


def test_fork_child_gets_own_slot(make_claim):
    c = make_claim(memory=LIMIT)
    p = c.run("tests/t_fork", LIMIT)
    assert "OK t_fork" in p.stdout, p.stdout


def _wait_stopped(pid, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError("the faulting process never stopped")


def test_stopped_then_killed_lock_holder(make_claim):
    """A live process stopped inside the region lock: allocations are refused after ~100 ms
    (never a hang), memory queries answer at once from the slots; once it dies, its
    half-made reservation is reclaimed, without a false "forged" line, and the claim gets the
    rest of its limit (another process holds 16Mi throughout)."""
    c = make_claim(memory=LIMIT)
    steady = c.popen("gpushare-probe", "alloc", "--chunk", "16Mi", "--max", "16Mi", "--hold", "60")
    holder = None
    try:
        assert "allocated=16777216" in steady.stdout.readline() + steady.stdout.readline()
        holder = c.popen("gpushare-probe", "alloc", "--chunk", "16Mi", "--max", "16Mi",
                         env={"GPUSHARE_TEST_FAULT": "stop_in_lock", "LD_PRELOAD": str(c.build / FAULTS_LIBRARY)})
        _wait_stopped(holder.pid)  # stopped inside the robust mutex, mid-update
        t0 = time.monotonic()
        refused = c.run("gpushare-probe", "alloc", "--chunk", "8Mi", timeout=30)
        refused_s = time.monotonic() - t0
        info = kv(c.run("gpushare-probe", "meminfo", timeout=30).stdout)
        holder.kill()
        holder.wait()
        after_run = c.run("gpushare-probe", "alloc", "--chunk", "8Mi", timeout=30)
        after = kv(after_run.stdout)
    finally:
        for p in (steady, holder):
            if p:
                p.kill()
                p.wait()
    out = kv(refused.stdout)
    assert out["result"] == "oom" and int(out["allocated"]) == 0, refused.stdout
    assert "lock kept by a live process" in refused.stderr, refused.stderr
    # the figure itself (~100 ms) is printed by hook/build/tests/t_region; this bound covers
    # process start-up on a loaded machine
    assert refused_s < 3.0, refused_s
    assert int(info["cu_free"]) == LIMIT - 32 * MiB and int(info["nvml_used"]) == 32 * MiB, info
    assert int(after["allocated"]) == LIMIT - 16 * MiB, after
    # the dead holder had raised its slot, not yet `used`: resynchronised, not called forged
    assert "recomputed" not in after_run.stderr, after_run.stderr


def test_fault_hook_only_in_the_test_build(make_claim):
    """The shipped library has no fault hook at all; the test build honours it only with a run
    dir (GPUSHARE_RUN_DIR), never with limits from the environment or /var/run/gpushare."""
    c = make_claim(memory=LIMIT)
    assert b"TEST_FAULT" not in (c.build / "libgpushare.so").read_bytes()
    fault = {"GPUSHARE_TEST_FAULT": "stop_in_lock"}
    env_limits = {"GPUSHARE_RUN_DIR": "", "GPUSHARE_MEMORY_LIMIT_0": str(LIMIT)}
    for library, env in (("libgpushare.so", {}), ("libgpushare.so", env_limits), (FAULTS_LIBRARY, env_limits)):
        p = c.run("gpushare-probe", "alloc", "--chunk", "16Mi",
                  env=dict(env, **fault, LD_PRELOAD=str(c.build / library)), timeout=10)
        assert int(kv(p.stdout)["allocated"]) == LIMIT, (library, env)


def test_dead_process_memory_reclaimed(make_claim):
    c = make_claim(memory=LIMIT)
    holder = c.popen("gpushare-probe", "alloc", "--chunk", "16Mi", "--max", "48Mi", "--hold", "60")
    try:
        lines = "".join(holder.stdout.readline() for _ in range(4))
        assert "allocated=50331648 chunks=3" in lines, lines
        assert int(kv(c.run("gpushare-probe", "meminfo").stdout)["cu_free"]) == 16 * MiB
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    finally:
        holder.kill()
        holder.wait()
    assert int(kv(c.run("gpushare-probe", "meminfo").stdout)["cu_free"]) == LIMIT
    assert int(kv(c.run("gpushare-probe", "alloc", "--chunk", "16Mi").stdout)["allocated"]) == LIMIT


def test_two_claims_are_independent(make_claim):
    a = make_claim(memory=LIMIT, name="a")
    b = make_claim(memory=2 * LIMIT, name="b")
    holder = a.popen("gpushare-probe", "alloc", "--chunk", "64Mi", "--max", "64Mi", "--hold", "30")
    try:
        holder.stdout.readline()
        assert int(kv(b.run("gpushare-probe", "alloc", "--chunk", "16Mi").stdout)["allocated"]) == 2 * LIMIT
    finally:
        holder.kill()
        holder.wait()


# An NVML reader that opened the simulated GPU before the holder died (as the node agent does):
# prints the GPU's used bytes and its compute processes each time a line arrives on stdin.
_NVML_READER = """
import ctypes, sys
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
mem = (ctypes.c_ulonglong * 3)()
for _ in sys.stdin:
    assert nvml.nvmlDeviceGetMemoryInfo(dev, mem) == 0
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(count), None)
    print(f"used={mem[2]} processes={count.value}", flush=True)
"""


def test_nvml_forgets_a_killed_process_at_once(make_claim):
    """The real driver frees a process's memory when it dies; the simulator once kept it in the
    GPU's used total (and the process in NVML's list) until another CUDA process started."""
    c = make_claim(memory=LIMIT)
    reader = subprocess.Popen([sys.executable, "-c", _NVML_READER], env=c.env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    holder = c.popen("gpushare-probe", "alloc", "--chunk", "16Mi", "--max", "48Mi", "--hold", "60")
    try:
        assert "allocated=50331648 chunks=3" in "".join(holder.stdout.readline() for _ in range(4))

        def read() -> dict:
            reader.stdin.write("\n")
            reader.stdin.flush()
            return kv(reader.stdout.readline())

        assert read() == {"used": str(48 * MiB), "processes": "1"}
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        assert read() == {"used": "0", "processes": "0"}
    finally:
        holder.kill()
        holder.wait()
        reader.kill()
        reader.wait()
