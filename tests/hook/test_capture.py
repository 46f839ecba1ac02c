"""CUDA graphs under the library: stream capture must never break (the simulated driver
invalidates a capture the way the real one does), and a graph replay is charged at its own
replay cost."""
import pytest

from tests.support import MiB
from tests.support.hook import kv


def graph(claim, *args, check=True):
    p = claim.run("gpushare-probe", "graph", *args, timeout=60, check=check)
    return kv(p.stdout), p


@pytest.mark.parametrize("mode", ["global", "thread", "relaxed"])
def test_capture_at_compute_50_succeeds_and_replays_at_50(make_claim, mode):
    c = make_claim(memory=64 * MiB, compute=50)
    out, p = graph(c, "--seconds", "3", "--kernel-us", "200", "--nodes", "10", "--mode", mode)
    assert out["capture_rc"] == "0", p.stdout + p.stderr
    assert abs(float(out["busy_share"]) - 50) <= 5, out


def test_capture_survives_launches_on_another_stream(make_claim):
    """Global mode forbids the library's event queries anywhere while the capture runs: the
    other stream's launches (sampled every 10 ms) must not touch events meanwhile."""
    c = make_claim(memory=64 * MiB, compute=50)
    out, p = graph(c, "--seconds", "1", "--nodes", "20", "--side-us", "300")
    assert out["capture_rc"] == "0", p.stdout + p.stderr


def test_simulator_invalidates_a_capture_like_the_driver(make_claim):
    """Without the library: an event record on the capturing stream breaks the capture (so the
    tests above would catch a library that records its own events there)."""
    c = make_claim(memory=64 * MiB, compute=50)
    p = c.run("gpushare-probe", "graph", "--record", "1", preload=False, check=False)
    out = kv(p.stdout)
    assert (out["call_rc"], out["capture_rc"], p.returncode) == ("900", "901", 1), p.stdout
