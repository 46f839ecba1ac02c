"""The fill relay (kubeletplugin/agent/relay.py): a Hard claim's launches, as its region shows
them, told to the filling Burst claim's control file within milliseconds; what a tenant writes
into its region bounded."""
import re
import time
from pathlib import Path

from kubeletplugin.agent.control import Control
from kubeletplugin.agent.regions import Region
from kubeletplugin.agent.relay import (
    CATCHUP_MARGIN_KERNELS,
    MARGIN_KERNELS,
    MARGIN_MIN_NS,
    OWNER_HOLD_NS,
    QUEUE_SANE_NS,
    RELAY_INTERVAL_NS,
    RELAY_NAP_MAX_NS,
    REQUEST_HOLD_NS,
    Relay,
    _nap_ns,
    fill_pairs,
)
from kubeletplugin.agent.shares import Share, plan_gpu
from kubeletplugin.hooklayout import CONTROL, CONTROL_SIZE, REGION_HEADER, REGION_MAGIC, REGION_SIZE, REGION_VERSION
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]


def files(tmp_path):
    region_path, control_path = tmp_path / "region", tmp_path / "control"
    data = bytearray(REGION_SIZE)
    REGION_HEADER["magic"].write(data, REGION_MAGIC)
    REGION_HEADER["version"].write(data, REGION_VERSION)
    region_path.write_bytes(data)
    control_path.write_bytes(bytes(CONTROL_SIZE))
    return region_path, control_path


def write(path, field, value):
    data = bytearray(path.read_bytes())
    REGION_HEADER[field].write(data, value)
    with open(path, "r+b") as f:  # in place: the relay has it mapped
        f.write(data[:4096])


def said(control_path):
    data = control_path.read_bytes()
    return CONTROL["owner_busy_until_ns"].read(data), CONTROL["relay_seen_ns"].read(data)


def test_the_relay_tells_the_filler_when_the_hard_claim_launches_and_stops_when_unwatched(tmp_path):
    region_path, control_path = files(tmp_path)
    region, control = Region(str(region_path)), Control(str(control_path))
    relay = Relay()
    try:
        relay.watch([([region], control, MARGIN_MIN_NS, OWNER_HOLD_NS)])
        wait_for(lambda: said(control_path)[1] > 0, timeout=5, what="the relay's first look")
        assert said(control_path)[0] == 0  # nothing launched yet
        # a launch, its queue predicted to end 5 ms on: busy until then and the margin
        launched = time.monotonic_ns()
        write(region_path, "pace_qend_ns", launched + 5_000_000)
        write(region_path, "pace_gpu_ns", 2_650_000)
        wait_for(lambda: said(control_path)[0] > 0, timeout=5, what="the launch relayed")
        until, seen = said(control_path)  # at least OWNER_HOLD_NS after the relay saw it (late on a loaded machine)
        assert until == launched + 5_000_000 + MARGIN_MIN_NS or launched + 5_000_000 + MARGIN_MIN_NS < until <= \
            seen + OWNER_HOLD_NS, (until - launched, seen - launched)
        first = until
        # a forged queue end far ahead is taken as QUEUE_SANE_NS (the filler's own timeline bounds the rest)
        before = time.monotonic_ns()
        write(region_path, "pace_qend_ns", before + 10**12)
        write(region_path, "pace_gpu_ns", 5_300_000)
        wait_for(lambda: said(control_path)[0] != first, timeout=5, what="relayed")
        until, seen = said(control_path)
        assert before + OWNER_HOLD_NS <= until <= seen + QUEUE_SANE_NS + MARGIN_MIN_NS
        relay.watch([])  # no fill any more: the control says there is no relay
        assert said(control_path) == (0, 0)
        time.sleep(0.05)
        assert said(control_path) == (0, 0)
    finally:
        relay.stop()
        region.close()
        control.close()


def test_the_relay_looks_often_only_while_a_hard_claim_may_be_idle():
    """Polling every 2 ms took 2.8-3.0 % of a core. While the Hard claims have work until a time
    it told, the filler waits that long anyway: the relay need look only a poll before it, and
    often enough that the filler never takes it for gone (hook/src/control.h, GS_RELAY_STALE_NS)."""
    now = 10**12
    assert _nap_ns(0, now) == RELAY_INTERVAL_NS  # no work said: a new burst is seen within a poll
    assert _nap_ns(now + OWNER_HOLD_NS, now) == RELAY_INTERVAL_NS
    assert _nap_ns(now + 8_000_000, now) == 8_000_000 - RELAY_INTERVAL_NS
    assert _nap_ns(now + QUEUE_SANE_NS + 20_000_000, now) == RELAY_NAP_MAX_NS
    stale = re.search(r"#define GS_RELAY_STALE_NS (\d+)ull", (ROOT / "hook/src/control.h").read_text())
    assert stale and 2 * RELAY_NAP_MAX_NS < int(stale[1])  # with room for a late wake-up


def test_fill_pairs_are_the_hard_claims_regions_and_the_fillers_control(tmp_path):
    region_path, control_path = files(tmp_path)
    region, control = Region(str(region_path)), Control(str(control_path))
    try:
        hard = Share(limit=0.5, burst=False, trusted=True, charged=0.3)
        burst = Share(limit=0.5, burst=True, trusted=True, charged=0.3, kernel_us=2650)
        plan_gpu([hard, burst])
        pairs = fill_pairs([("gpu0", hard, region, None), ("gpu0", burst, None, control)])
        assert pairs == [([region], control, MARGIN_KERNELS * 2650 * 1000, OWNER_HOLD_NS)]
        plan_gpu([hard, burst, Share(limit=0.0, burst=True, trusted=True)])  # two Burst claims: no fill
        assert not burst.fill
        # but each claim is told of the others' work (catching up outside its slot, issue 39)
        assert fill_pairs([("gpu0", hard, region, None), ("gpu0", burst, None, control)]) == [
            ([region], control, CATCHUP_MARGIN_KERNELS * 2650 * 1000, CATCHUP_MARGIN_KERNELS * 2650 * 1000)]
    finally:
        region.close()
        control.close()


def test_every_claim_of_a_gpu_without_a_filler_is_told_of_the_others_work(tmp_path):
    """Catching up (issue 39): where no Burst claim fills, each busy paced claim's control gets the
    GPU's other claims' regions (relay pairs); none for an idle claim, none on a GPU with contexts
    nobody paces, or alone."""
    for i in range(2):
        (tmp_path / str(i)).mkdir()
    files_ = [files(tmp_path / str(i)) for i in range(2)]
    regions = [Region(str(r)) for r, _ in files_]
    controls = [Control(str(c)) for _, c in files_]
    try:
        shares = [Share(limit=0.3, burst=False, trusted=True, charged=0.3, kernel_us=450),
                  Share(limit=0.7, burst=False, trusted=True, charged=0.6)]
        plan_gpu(shares)
        assert all(s.catchup for s in shares)
        gpus = [("gpu0", s, r, c) for s, r, c in zip(shares, regions, controls, strict=True)]
        assert fill_pairs(gpus) == [([regions[1]], controls[0], OWNER_HOLD_NS, OWNER_HOLD_NS),  # 2 x 450 us
                                    ([regions[0]], controls[1], OWNER_HOLD_NS, OWNER_HOLD_NS)]
        light = [Share(limit=0.5, burst=False, trusted=True, charged=0.05), Share(limit=0.5, burst=False, trusted=True,
                                                                                  charged=0.5, kernel_us=410)]
        plan_gpu(light)  # beside a claim that uses a tenth of its share (a request server), a long hold
        assert fill_pairs([("gpu0", s, r, c) for s, r, c in zip(light, regions, controls, strict=True)])[1] == (
            [regions[0]], controls[1], OWNER_HOLD_NS, REQUEST_HOLD_NS)
        shares[0].charged = 0.0  # idle: no relay for it
        plan_gpu(shares)
        assert fill_pairs(gpus) == [([regions[0]], controls[1], OWNER_HOLD_NS, OWNER_HOLD_NS)]
        shares[1].unpaced = True
        plan_gpu(shares)
        assert fill_pairs(gpus) == []
        plan_gpu(shares[:1])
        assert fill_pairs(gpus[:1]) == []
    finally:
        for x in (*regions, *controls):
            x.close()
