"""Compute pacing on the simulated GPU (kernels of 100 us, run serially)."""
import struct

import pytest

from kubeletplugin.hooklayout import REGION_HEADER
from tests.support import CPU_TIMED, MiB
from tests.support.hook import kv

SECONDS = "2.5"


def busy(claim, **kw):
    out = kv(claim.run("gpushare-probe", "launch", "--seconds", SECONDS, timeout=60, **kw).stdout)
    return float(out["busy_share"]), out


@CPU_TIMED
@pytest.mark.parametrize("share", [10, 30, 50, 90])
def test_pacing_within_5_points(make_claim, share):
    c = make_claim(memory=64 * MiB, compute=share)
    got, out = busy(c)
    assert abs(got - share) <= 5, out


@CPU_TIMED
def test_limit_100_is_not_paced(make_claim):
    c = make_claim(memory=64 * MiB, compute=100)
    got, out = busy(c)
    assert got >= 95, out


@CPU_TIMED
def test_node_agent_rate_lowers_share(make_claim):
    c = make_claim(memory=64 * MiB, compute=50)
    c.run("gpushare-probe", "meminfo")  # initialise the region
    with open(c.region(0), "r+b") as f:
        f.seek(REGION_HEADER["pace_rate_ppm"].offset)
        f.write(struct.pack("<I", 200_000))  # 20 %
    got, out = busy(c)
    assert abs(got - 20) <= 5, out


@CPU_TIMED
@pytest.mark.parametrize("control", [False, True])
def test_tenant_cannot_raise_rate_under_hard_policy(make_claim, control):
    """The region is tenant-writable: its rate stays capped at the limit, also beside a control
    file the agent has not written a rate into."""
    c = make_claim(memory=64 * MiB, compute=30)
    if control:
        c.write_control(0)
    c.run("gpushare-probe", "meminfo")
    with open(c.region(0), "r+b") as f:
        f.seek(REGION_HEADER["pace_tat_ns"].offset)  # pace_rate_ppm follows it
        f.write(struct.pack("<QI", 0, 1_000_000))  # reset the bucket, claim the whole GPU
    got, out = busy(c)
    assert abs(got - 30) <= 5, out


@CPU_TIMED
def test_share_is_per_claim_not_per_process(make_claim):
    """two processes of one claim at 40 % get 40 % together"""
    c = make_claim(memory=64 * MiB, compute=40)
    procs = [c.popen("gpushare-probe", "launch", "--seconds", SECONDS) for _ in range(2)]
    outs = [kv(p.communicate(timeout=60)[0]) for p in procs]
    # from launch rates and the simulated kernel time (a calibration can queue behind the other)
    total = sum(float(o["launches_per_s"]) for o in outs) * 100e-6 * 100
    assert abs(total - 40) <= 5, outs


@CPU_TIMED
def test_control_rate_may_exceed_the_limit(make_claim):
    """The control file is root-owned and read-only in the container: its rate is trusted,
    above the limit too (the agent holds the measured share to the limit), and beats the region's."""
    c = make_claim(memory=64 * MiB, compute=30)
    c.write_control(600_000)
    c.run("gpushare-probe", "meminfo")
    with open(c.region(0), "r+b") as f:
        f.seek(REGION_HEADER["pace_rate_ppm"].offset)
        f.write(struct.pack("<I", 100_000))  # 10 %
    got, out = busy(c)
    assert abs(got - 60) <= 5, out


@pytest.mark.parametrize("header", [{"magic": 0x1234}, {"version": 2}])
def test_bad_control_file_is_ignored_with_one_log_line(make_claim, header):
    c = make_claim(memory=64 * MiB, compute=30)
    c.write_control(1_000_000, **header)
    p = c.run("gpushare-probe", "launch", "--seconds", SECONDS, timeout=60)
    got = float(kv(p.stdout)["busy_share"])
    assert abs(got - 30) <= 5, p.stdout  # the limit
    lines = [line for line in p.stderr.splitlines() if "control file" in line]
    assert len(lines) == 1 and "ignored" in lines[0], p.stderr


def test_control_file_of_wrong_size_is_ignored(make_claim):
    c = make_claim(memory=64 * MiB, compute=30)
    c.write_control(1_000_000)
    with open(c.root / "control" / "0", "ab") as f:
        f.write(b"x")
    got, out = busy(c)
    assert abs(got - 30) <= 5, out
