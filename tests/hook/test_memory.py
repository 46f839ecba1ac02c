"""Memory limits: counting of every allocation API, OOM at the limit, reporting, fail-closed."""
import struct

import pytest

from kubeletplugin.hooklayout import HEADER_SIZE, REGION_HEADER
from tests.support import MiB
from tests.support.hook import kv, sim_uuid

LIMIT = 64 * MiB


def test_every_api_counted_and_freed(make_claim):
    c = make_claim(memory=LIMIT)
    p = c.run("tests/t_apis", LIMIT)
    assert "OK t_apis failures=0" in p.stdout, p.stdout


def test_other_memory_paths_counted_or_refused(make_claim):
    """Legacy (CUDA < 3.2) entry points and graph memory refused, VMM handles released while
    mapped still counted, context heap/FIFO/stack limits counted (hook/README.md's list)."""
    c = make_claim(memory=LIMIT)
    p = c.run("tests/t_paths", LIMIT)
    assert "OK t_paths failures=0" in p.stdout, p.stdout + p.stderr
    assert "refused under a gpushare claim" in p.stderr and "graph memory is not counted" in p.stderr, p.stderr
    # the simulated driver serves every one of those paths: the refusals are the library's
    p = c.run("tests/t_paths", LIMIT, "nohook", preload=False)
    assert "OK t_paths nohook failures=0" in p.stdout, p.stdout


def test_failed_real_allocation_releases_reservation(make_claim):
    c = make_claim(memory=LIMIT, sim={"GPUSHARE_SIM_MEMORY": "1Mi"})
    p = c.run("tests/t_apis", LIMIT, "physfail")
    assert "OK t_apis physfail" in p.stdout, p.stdout


@pytest.mark.parametrize("api", ["alloc", "managed", "async", "pitch", "vmm"])
def test_probe_oom_exactly_at_limit(make_claim, api):
    c = make_claim(memory=LIMIT)
    out = kv(c.run("gpushare-probe", "alloc", "--chunk", "4Mi", "--api", api).stdout)
    assert out["result"] == "oom"
    assert int(out["allocated"]) == LIMIT
    assert out["free_errors"] == "0"


def test_meminfo_reports_limit(make_claim):
    c = make_claim(memory=LIMIT)
    out = kv(c.run("gpushare-probe", "meminfo").stdout)
    for k in ("cu_total", "cu_free", "device_total", "nvml_total", "nvml_free", "nvml2_total", "nvml2_free"):
        assert int(out[k]) == LIMIT, (k, out)
    plain = kv(c.run("gpushare-probe", "meminfo", preload=False).stdout)
    assert int(plain["cu_total"]) == 16 << 30  # the simulated device itself


def test_meminfo_counts_other_processes(make_claim):
    c = make_claim(memory=LIMIT)
    holder = c.popen("gpushare-probe", "alloc", "--chunk", "16Mi", "--max", "16Mi", "--hold", "30")
    try:
        assert "allocated=16777216" in holder.stdout.readline() + holder.stdout.readline()
        out = kv(c.run("gpushare-probe", "meminfo").stdout)
        assert int(out["cu_total"]) == LIMIT and int(out["cu_free"]) == LIMIT - 16 * MiB
        assert int(out["nvml_used"]) == 16 * MiB and int(out["nvml_free"]) == LIMIT - 16 * MiB
    finally:
        holder.kill()
        holder.wait()


def test_environment_cannot_raise_limit(make_claim):
    c = make_claim(memory=LIMIT)
    env = {"GPUSHARE_MEMORY_LIMIT_0": str(1 << 40), "GPUSHARE_GPU_COUNT": "1"}
    out = kv(c.run("gpushare-probe", "alloc", "--chunk", "8Mi", env=env).stdout)
    assert int(out["allocated"]) == LIMIT


def test_region_scribble_cannot_raise_limit(make_claim):
    """A tenant writing the region (usage counters, rate) can confuse accounting only up to
    what it already holds; the limit itself is not in the region."""
    c = make_claim(memory=LIMIT)
    c.run("gpushare-probe", "meminfo")  # initialises the region
    with open(c.region(0), "r+b") as f:
        f.seek(REGION_HEADER["pace_rate_ppm"].offset)
        f.write(struct.pack("<I", 1_000_000))  # "full GPU"
    out = kv(c.run("gpushare-probe", "alloc", "--chunk", "8Mi").stdout)
    assert int(out["allocated"]) == LIMIT


def test_uuid_selects_the_limited_device(make_claim):
    # two simulated GPUs; the claim holds only GPU 1 (by UUID), listed as its slot 0
    c = make_claim(gpus=[{"memory": LIMIT, "uuid": sim_uuid(1)}], sim={"GPUSHARE_SIM_DEVICES": "2"})
    limited = kv(c.run("gpushare-probe", "--device", "1", "alloc", "--chunk", "8Mi").stdout)
    assert int(limited["allocated"]) == LIMIT
    free = kv(c.run("gpushare-probe", "--device", "0", "alloc", "--chunk", "8Mi", "--max", "256Mi").stdout)
    assert free["result"] == "max" and int(free["allocated"]) == 256 * MiB


@pytest.mark.parametrize("content,where", [
    ("hello world\n", ":1: not KEY=VALUE"),
    ("GPUSHARE_LIMITS_VERSION=1\nGPUSHARE_MEMORY_LIMIT_0=12abc\n", ":2: bad value '12abc'"),
    ("GPUSHARE_LIMITS_VERSION=1\nGPUSHARE_MEMORY_LIMIT_0=0\n", "bad value '0'"),
    ("GPUSHARE_LIMITS_VERSION=1\nGPUSHARE_MEMORY_LIMIT_0=1024\nGPUSHARE_COMPUTE_LIMIT_0=101\n", "bad value '101'"),
    ("GPUSHARE_LIMITS_VERSION=2\nGPUSHARE_MEMORY_LIMIT_0=1024\n", "bad value '2'"),
    ("GPUSHARE_LIMITS_VERSION=1\nGPUSHARE_MEMORY_LIMIT_0=1024\nGPUSHARE_SHARING_STRATEGY=mps\n", "bad value 'mps'"),
    ("GPUSHARE_LIMITS_VERSION=1\nGPUSHARE_MEMORY_LIMIT_0=1024\nGPUSHARE_SM_COUNT_0=0\n", "bad value '0'"),
    ("GPUSHARE_MEMORY_LIMIT_0=1024\n", "no GPUSHARE_LIMITS_VERSION"),
    ("", "no GPUSHARE_LIMITS_VERSION"),
])
def test_garbage_limits_fail_closed(make_claim, content, where):
    c = make_claim(memory=LIMIT)
    c.limits.write_text(content)
    p = c.run("gpushare-probe", "alloc", "--chunk", "1Mi")
    out = kv(p.stdout)
    assert out["result"] == "oom" and out["allocated"] == "0"
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("gpushare: ")]
    assert len(lines) == 1 and str(c.limits) in lines[0] and where in lines[0], p.stderr
    info = kv(c.run("gpushare-probe", "meminfo").stdout)
    assert info["cu_total"] == "0" and info["cu_free"] == "0" and info["nvml_total"] == "0"


def test_unreadable_limits_fail_closed(make_claim):
    c = make_claim(memory=LIMIT)
    c.limits.unlink()
    c.limits.mkdir()  # exists, cannot be read as a file
    out = kv(c.run("gpushare-probe", "alloc", "--chunk", "1Mi").stdout)
    assert out["allocated"] == "0"


def test_corrupt_region_fails_closed(make_claim):
    c = make_claim(memory=LIMIT)
    with open(c.region(0), "r+b") as f:
        f.write(b"\xff" * 64)
    p = c.run("gpushare-probe", "alloc", "--chunk", "1Mi")
    assert kv(p.stdout)["allocated"] == "0"
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("gpushare: ")]
    assert len(lines) == 1 and "corrupt" in lines[0], p.stderr


def test_unknown_region_version_fails_closed(make_claim):
    c = make_claim(memory=LIMIT)
    c.run("gpushare-probe", "meminfo")
    with open(c.region(0), "r+b") as f:
        f.seek(REGION_HEADER["version"].offset)
        f.write(struct.pack("<I", 99))
    p = c.run("gpushare-probe", "alloc", "--chunk", "1Mi")
    assert kv(p.stdout)["allocated"] == "0"
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("gpushare: ")]
    assert len(lines) == 1 and "unknown version 99" in lines[0], p.stderr


def test_wrong_region_size_fails_closed(make_claim):
    c = make_claim(memory=LIMIT)
    with open(c.region(0), "r+b") as f:
        f.truncate(HEADER_SIZE)
    assert kv(c.run("gpushare-probe", "alloc", "--chunk", "1Mi").stdout)["allocated"] == "0"


def test_environment_only_mode(make_claim):
    c = make_claim(memory=LIMIT)
    env = {"GPUSHARE_RUN_DIR": "", "GPUSHARE_MEMORY_LIMIT_0": str(32 * MiB), "GPUSHARE_COMPUTE_LIMIT_0": "100"}
    out = kv(c.run("gpushare-probe", "alloc", "--chunk", "4Mi", env=env).stdout)
    assert int(out["allocated"]) == 32 * MiB
    bad = kv(c.run("gpushare-probe", "alloc", "--chunk", "4Mi",
                   env=dict(env, GPUSHARE_MEMORY_LIMIT_0="lots")).stdout)
    assert bad["allocated"] == "0"


def test_no_claim_passes_through(make_claim):
    c = make_claim(memory=LIMIT)
    p = c.run("gpushare-probe", "alloc", "--chunk", "64Mi", "--max", "512Mi", env={"GPUSHARE_RUN_DIR": ""})
    assert kv(p.stdout)["result"] == "max" and p.stderr == ""
