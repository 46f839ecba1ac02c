"""The agent's slot layout (dra_driver/agent/shares.py), without processes."""
from dra_driver.agent.shares import PERIOD_US, Share, plan_gpu


def share(limit, burst=False, busy=False):
    return Share(limit=limit, burst=burst, trusted=True, charged=0.5 if busy else 0.0)


def layout(shares):
    plan_gpu(shares)
    return [(s.start_us, s.length_us, round(s.rate, 3)) for s in shares]


def test_hard_claims_get_consecutive_slots_at_their_limits():
    assert layout([share(0.2), share(0.3), share(0.5)]) == [
        (0, 4000, 0.2), (4000, 6000, 0.3), (10000, 10000, 0.5)]


def test_busy_burst_claim_alone_gets_the_whole_period():
    b = share(0.3, burst=True, busy=True)
    assert layout([share(0.5), b])[1] == (10000, PERIOD_US, 1.0)


def test_burst_claim_hands_back_when_the_other_is_busy():
    b = share(0.3, burst=True, busy=True)
    # Hard 50 busy: the Burst claim keeps its slot and the unallocated 20 % after it
    assert layout([share(0.5, busy=True), b]) == [(0, 10000, 0.5), (10000, 10000, 0.5)]


def test_idle_burst_claim_keeps_its_own_slot_and_burst_claims_go_last():
    assert layout([share(0.3, burst=True), share(0.7)]) == [(14000, 6000, 0.3), (0, 14000, 0.7)]
