"""The agent's slot layout (kubeletplugin/agent/shares.py), without processes."""
import signal
import subprocess
import sys

from kubeletplugin.agent.shares import (
    KERNEL_REPORTS,
    LEND_MARGIN_US,
    MAX_PERIOD_US,
    MPS_PERIOD_US,
    PERIOD_US,
    Share,
    plan_gpu,
    slot_loss,
)
from kubeletplugin.hooklayout import CONTROL, REGION_HEADER, REGION_MAGIC, REGION_SIZE, REGION_VERSION
from tests.support import wait_for


def share(limit, burst=False, busy=False):
    return Share(limit=limit, burst=burst, trusted=True, charged=0.5 if busy else 0.0)


def layout(shares):
    plan_gpu(shares)
    return [(s.start_us, s.length_us, round(s.rate, 3)) for s in shares]


def test_hard_claims_get_consecutive_slots_at_their_limits():
    assert layout([share(0.2), share(0.3), share(0.5)]) == [
        (0, 40000, 0.2), (40000, 60000, 0.3), (100000, 100000, 0.5)]


def test_busy_hard_claim_covers_idle_slots_at_its_rate():
    """A busy Hard claim's slot runs on to the next busy claim's slot (here: over the idle one and
    the unallocated rest), its rate stays its limit; alone it has the whole period, so the library
    leaves no room for context switches that do not happen (docs/compute.md)."""
    assert layout([share(0.3, busy=True), share(0.2), share(0.3, busy=True)]) == [
        (0, 100000, 0.3), (60000, 40000, 0.2), (100000, 100000, 0.3)]
    assert layout([share(0.3, busy=True), share(0.2)]) == [(0, PERIOD_US, 0.3), (60000, 40000, 0.2)]


def test_one_burst_claim_fills_behind_the_hard_claims():
    """Where one Burst claim shares the GPU with Hard claims, the Hard claims' slots are laid out
    alone (a busy one's covers the period up to the next busy one's) and the Burst claim fills:
    `lent_us` is the whole period, its rate its limit (what its library paces at without the
    agent's relay), and it has a slot of its limit's length only so that a library reads the
    plan as valid (docs/compute.md, "The fill")."""
    hard, b = share(0.5, busy=True), share(0.3, burst=True, busy=True)
    assert layout([hard, b]) == [(0, PERIOD_US, 0.5), (0, 60000, 0.3)]
    assert (hard.fill, b.fill, hard.lent_us, b.lent_us) == (False, True, 0, PERIOD_US)
    two = [share(0.3, busy=True), share(0.2), share(0.4, burst=True)]
    assert layout(two) == [(0, PERIOD_US, 0.3), (60000, 40000, 0.2), (0, 80000, 0.4)]
    assert two[2].fill
    idle = [share(0.7), share(0.3, burst=True, busy=True)]
    assert layout(idle) == [(0, 140000, 0.7), (0, 60000, 0.3)] and idle[1].fill


def test_no_fill_for_two_burst_claims_a_claim_of_several_processes_or_beside_unpaced_contexts():
    """Filling claims would time-slice each other with nothing to hold them to their limits, a
    claim of several processes takes turns in a slot instead, and beside contexts nobody paces
    the relay does not see all the work: those keep the slots."""
    def burst_busy():
        return share(0.3, burst=True, busy=True)
    cases = [[share(0.4, busy=True), burst_busy(), burst_busy()], [share(0.7, busy=True), burst_busy()],
             [share(0.7, busy=True), burst_busy()], [burst_busy()]]
    cases[1][1].procs = 2
    for s in cases[2]:
        s.unpaced = True
    for shares in cases:
        plan_gpu(shares)
        assert not any(s.fill for s in shares), shares
        assert all(s.lent_us < PERIOD_US for s in shares), shares


def test_a_busy_burst_claim_alone_gets_the_whole_period():
    assert layout([share(0.3, burst=True, busy=True)]) == [(0, PERIOD_US, 1.0)]


def test_burst_claims_hand_back_when_the_other_is_busy_and_go_last():
    """Two Burst claims (no fill): a busy one's slot covers what follows it up to the next busy
    claim's, with the rate to match; an idle one keeps its own slot."""
    b = share(0.3, burst=True, busy=True)
    assert layout([share(0.5, busy=True), b, share(0.2, burst=True)]) == [
        (0, 100000, 0.5), (100000, 100000, 0.5), (160000, 40000, 0.2)]
    assert layout([share(0.3, burst=True), share(0.2, burst=True), share(0.5)]) == [
        (100000, 60000, 0.3), (160000, 40000, 0.2), (0, 100000, 0.5)]


def test_a_busy_burst_claim_is_lent_the_idle_tail_of_the_hard_slot_before_it():
    """Without the fill (two Burst claims here), a busy Hard claim that charged less GPU time than
    its slot holds (a bursty one: 25 % in its 50 % slot) lends the slot's idle tail, less a margin,
    to the busy Burst claim whose slot follows (`lent_us`, right before the Burst claim's slot: the
    library launches there while the GPU is free of other work). Its charged time is averaged over
    the periods, the last one counting at once when it is more; a Hard claim that uses its slot
    lends nothing, nor does an idle Burst claim borrow (docs/compute.md, "the lent span")."""
    hard, burst = Share(limit=0.5, burst=False, trusted=True, charged=0.25), share(0.3, burst=True, busy=True)
    other = share(0.2, burst=True)
    assert layout([hard, burst, other]) == [(0, 100000, 0.5), (100000, 100000, 0.5), (160000, 40000, 0.2)]
    assert (hard.lent_us, burst.lent_us) == (0, 100000 - 50000 - LEND_MARGIN_US)
    hard.charged = 0.45  # two bursts in the last period: at once
    plan_gpu([hard, burst, other])
    assert burst.lent_us == 0
    hard.charged = 0.25  # one again: the average (0.25, 0.30, 0.2875) keeps a longer part
    plan_gpu([hard, burst, other])
    assert burst.lent_us == 100000 - 57500 - LEND_MARGIN_US
    hard.charged = 0.5  # it uses its slot
    plan_gpu([hard, burst, other])
    assert burst.lent_us == 0
    idle = share(0.3, burst=True)
    plan_gpu([Share(limit=0.5, burst=False, trusted=True, charged=0.1), idle, share(0.2, burst=True)])
    assert idle.lent_us == 0


def test_an_oversubscribed_gpu_gives_every_claim_its_part_and_says_so():
    """Limits summing past the GPU (claims prepared past the allocator: bench-agent put 258 % on
    one GPU) once gave the last claims slots of no length; each now gets its limit over the sum."""
    shares = [share(0.5), share(0.5), share(0.3, burst=True), share(0.7)]
    assert plan_gpu(shares) == 2.0
    assert [(s.start_us, s.length_us, round(s.rate, 3)) for s in shares] == [
        (0, 50000, 0.25), (50000, 50000, 0.25), (0, 30000, 0.15), (100000, 70000, 0.35)]
    assert plan_gpu([share(0.3), share(0.7)]) == 1.0


def long(limit, kernel_us, busy=True):
    return Share(limit=limit, burst=False, trusted=True, charged=0.5 if busy else 0.0, kernel_us=kernel_us)


def period(shares, mps_only=False):
    plan_gpu(shares, mps_only=mps_only)
    assert len({s.period_us for s in shares}) == 1
    return shares[0].period_us


def test_the_period_is_the_shortest_in_which_no_busy_slot_loses_more_than_one_percent():
    """A slot holds whole kernels, so a Hard 10 claim of 12 ms kernels lost 7.7 of its 20 ms slot at
    the 200 ms period (6.5 % of the GPU): the period is the shortest, in steps of PERIOD_US up to
    MAX_PERIOD_US, in which no busy claim's slot loses more than 1 % of it after its switch (0.3 ms)
    and its last whole kernel (docs/compute.md)."""
    assert slot_loss(20_000, 12_000) == 7_700
    assert slot_loss(2_000, 2650) == 0  # shorter than a kernel: paced over periods by its timeline
    assert period([long(0.1, 12_000), long(0.9, 2650)]) == 400_000  # 39.7 ms: 3 kernels, 3.7 ms left
    assert period([long(0.1, 2650), long(0.3, 2650), long(0.6, 2650)]) == PERIOD_US  # 1.15 / 1.4 / 0.45 ms
    # an idle claim's kernels do not matter, and a busy claim whose slot covers the period drains nothing
    assert period([long(0.1, 12_000, busy=False), long(0.9, 2650)]) == PERIOD_US
    assert period([long(0.1, 5000), long(0.9, 2650)]) == 600_000  # 4.7 ms left of 20, 40 and 60
    assert period([long(0.1, 16_620), long(0.9, 2650)]) == MAX_PERIOD_US  # no period is enough: the longest
    # oversubscribed (limits summing to 2): each slot is half its limit
    assert period([long(0.2, 12_000), long(0.8, 2650), long(1.0, 2650)]) == 400_000
    assert period([long(0.1, 12_000), long(0.9, 2650)], mps_only=True) == MPS_PERIOD_US  # no handover to drain
    assert period([share(0.3)]) == PERIOD_US


BOOKED_100MS = 100_000_000  # GPU ns charged in a 0.25 s agent period: 0.4 of it


def test_a_claim_busy_once_a_long_period_stays_busy_and_its_kernel_length_is_kept():
    """With a 1 s period and the share agent's 0.25 s periods, a claim launches in one agent period
    of four: it stays busy for a slot period after it charged time (else its slot, and with it the
    period, would flip every agent period). Its kernel length is the smaller of its last two
    reports, kept through agent periods without a launch: a first cost sample beside busy claims
    counts their slices, and each change of the period moves every slot of the GPU."""
    s = Share(limit=0.1, burst=False, trusted=True, period_us=1_000_000)
    s.count(BOOKED_100MS, 0.25, 30_000)  # the first sample, inflated: no length yet
    assert s.busy and s.kernel_us == 0
    for _ in range(KERNEL_REPORTS - 1):
        s.count(BOOKED_100MS, 0.25, 12_000)
    for _ in range(3):
        s.count(0, 0.25, 0)
        assert s.busy and s.kernel_us == 12_000
    s.count(0, 0.25, 0)  # a whole slot period without a launch
    assert not s.busy
    s.count(BOOKED_100MS, 0.25, 13_000)
    assert s.busy and s.kernel_us == 12_000
    s.count(BOOKED_100MS, 0.25, 1000)  # shorter kernels from now on
    assert s.kernel_us == 1000


def run_dirs(tmp_path, limits):
    """Claims laid out as GPUSHARE_RUN_DIR: a limits file and a zeroed region each."""
    dirs = []
    for i, (limit, policy) in enumerate(limits):
        d = tmp_path / f"c{i}"
        (d / "region").mkdir(parents=True)
        (d / "limits").write_text(f"GPUSHARE_LIMITS_VERSION=1\nGPUSHARE_GPU_COUNT=1\nGPUSHARE_DEVICE_UUID_0=GPU-x\n"
                                  f"GPUSHARE_MEMORY_LIMIT_0=1024\nGPUSHARE_COMPUTE_LIMIT_0={limit}\n"
                                  f"GPUSHARE_COMPUTE_POLICY_0={policy}\n")
        with open(d / "region" / "0", "wb") as f:
            f.truncate(REGION_SIZE)
        dirs.append(d)
    return dirs


def control_fields(d):
    return {f: CONTROL[f].read((d / "control" / "0").read_bytes()) for f in CONTROL}


def test_share_agent_writes_slots_into_run_dirs(tmp_path):
    """`gpushare-dra share-agent`'s period over claims laid out with GPUSHARE_RUN_DIR: control
    files created and given slots in the order given; the one Burst claim fills behind the Hard one."""
    from kubeletplugin.agent.standalone import RunDirClaim, tick

    dirs = run_dirs(tmp_path, [(30, "Hard"), (50, "Burst"), (100, "Hard")])
    claims = [RunDirClaim(str(d)) for d in dirs]
    tick(claims, 0.25)
    got = [control_fields(d) for d in dirs[:2]]
    # slot = start | length << 32
    assert [(g["rate_ppm"], g["slot"] & 0xFFFFFFFF, g["slot"] >> 32, g["period_us"]) for g in got] == [
        (300_000, 0, 60000, PERIOD_US), (500_000, 0, 100000, PERIOD_US)]
    assert [g["lent_us"] for g in got] == [0, PERIOD_US]
    assert not (dirs[2] / "control").exists()  # limit 100: never paced


def test_share_agent_sizes_the_period_by_the_longest_launch_the_library_reports(tmp_path):
    """The library keeps its claim's longest booked launch in the region (`pace_kernel_us`, us); the
    agent reads it each period, zeroes it, and lengthens the GPU's slot period for it."""
    from kubeletplugin.agent.standalone import RunDirClaim, tick

    dirs = run_dirs(tmp_path, [(10, "Hard"), (90, "Hard")])
    for d in dirs:  # an initialised region, as the library leaves it, its claim busy
        data = bytearray((d / "region" / "0").read_bytes())
        REGION_HEADER["magic"].write(data, REGION_MAGIC)
        REGION_HEADER["version"].write(data, REGION_VERSION)
        (d / "region" / "0").write_bytes(data)
    claims = [RunDirClaim(str(d)) for d in dirs]
    tick(claims, 0.25)
    assert control_fields(dirs[0])["period_us"] == PERIOD_US
    for n in range(1, KERNEL_REPORTS + 1):  # a length counts once reported KERNEL_REPORTS times
        assert control_fields(dirs[0])["period_us"] == PERIOD_US, n
        for d, us in zip(dirs, (12_000, 2650), strict=True):
            data = bytearray((d / "region" / "0").read_bytes())
            REGION_HEADER["pace_kernel_us"].write(data, us)
            REGION_HEADER["pace_gpu_ns"].write(data, n * 100_000_000)  # busy
            (d / "region" / "0").write_bytes(data)
        tick(claims, 0.25)
    assert [control_fields(d)["period_us"] for d in dirs] == [400_000, 400_000]
    assert [control_fields(d)["slot"] >> 32 for d in dirs] == [40_000, 360_000]
    assert REGION_HEADER["pace_kernel_us"].read((dirs[0] / "region" / "0").read_bytes()) == 0  # taken


def test_share_agent_zeroes_rates_and_slots_on_sigterm(tmp_path):
    """bench-share and gpu-validate.sh stop the agent with SIGTERM: the claims must run unpaced
    after it, not stay held to a slot nobody moves."""
    dirs = run_dirs(tmp_path, [(30, "Hard")])
    agent = subprocess.Popen([sys.executable, "-m", "dra_driver.cli", "share-agent", "--interval", "0.05",
                              "--log-level", "warning", str(dirs[0])], stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (dirs[0] / "control" / "0").exists() and control_fields(dirs[0])["rate_ppm"] == 300_000)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0, agent.stderr.read() if agent.stderr else ""
    finally:
        agent.kill()
    got = control_fields(dirs[0])
    assert (got["rate_ppm"], got["slot"], got["period_us"]) == (0, 0, 0), got
