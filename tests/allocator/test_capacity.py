"""Capacity mode: one shared device per GPU, consumable memory/compute with a requestPolicy."""

import uuid

import pytest

from playground.allocator import AllocationError
from tests.support.shapes import NODE, allocate_on, capacity_slice, claim, exactly, pod, results, with_status


def test_request_records_consumed_capacity_share_id_and_node():
    the_pod = pod()
    status = allocate_on(claim(exactly(capacity={"memory": "10Gi", "compute": "30"})), [capacity_slice()], pod=the_pod)
    [result] = results(status)
    assert result["request"] == "gpu"
    assert (result["driver"], result["pool"], result["device"]) == ("gpushare.dev", NODE, "gpu-0")
    assert result["consumedCapacity"] == {"memory": "10Gi", "compute": "30"}
    assert uuid.UUID(result["shareID"]).version == 4
    assert status["allocation"]["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
    assert status["reservedFor"] == [{"resource": "pods", "name": "pod-a", "uid": the_pod["metadata"]["uid"]}]


def test_without_pod_reserved_for_is_empty():
    assert allocate_on(claim(exactly()), [capacity_slice()])["reservedFor"] == []


@pytest.mark.parametrize("asked, consumed", [
    ("1000Mi", "1Gi"),  # rounded up to the next 256Mi step
    ("100Mi", "256Mi"),  # below min: min
    ("256Mi", "256Mi"),
    ("1", "256Mi"),
    ("80Gi", "80Gi"),
])
def test_memory_rounded_by_request_policy(asked, consumed):
    [result] = results(allocate_on(claim(exactly(capacity={"memory": asked})), [capacity_slice()]))
    assert result["consumedCapacity"]["memory"] == consumed


def test_above_policy_max_is_refused():
    with pytest.raises(AllocationError, match=r"request 'gpu'.*memory 81Gi is above the device's maximum 80Gi"):
        allocate_on(claim(exactly(capacity={"memory": "81Gi"})), [capacity_slice()])


def test_unrequested_capacity_takes_the_policy_default():
    [result] = results(allocate_on(claim(exactly(capacity={"memory": "2Gi"})), [capacity_slice()]))
    assert result["consumedCapacity"] == {"memory": "2Gi", "compute": "10"}
    [result] = results(allocate_on(claim(exactly()), [capacity_slice()]))
    assert result["consumedCapacity"] == {"memory": "1Gi", "compute": "10"}


def test_without_policy_unrequested_capacity_takes_the_whole_value():
    slices = [capacity_slice()]
    del slices[0]["spec"]["devices"][0]["capacity"]["compute"]["requestPolicy"]
    [result] = results(allocate_on(claim(exactly(capacity={"memory": "1Gi"})), slices))
    assert result["consumedCapacity"] == {"memory": "1Gi", "compute": "100"}


def test_valid_values_policy_picks_smallest_fitting_value():
    slices = [capacity_slice()]
    slices[0]["spec"]["devices"][0]["capacity"]["compute"]["requestPolicy"] = {"validValues": ["25", "50", "100"]}
    [result] = results(allocate_on(claim(exactly(capacity={"compute": "30"})), slices))
    assert result["consumedCapacity"]["compute"] == "50"
    with pytest.raises(AllocationError, match="above every valid value"):
        allocate_on(claim(exactly(capacity={"compute": "101"})), slices)


def test_claims_share_a_gpu_until_memory_runs_out():
    slices = [capacity_slice()]
    allocated = []
    for _ in range(2):
        c = claim(exactly(capacity={"memory": "30Gi", "compute": "10"}))
        allocated.append(with_status(c, allocate_on(c, slices, allocated=allocated)))
    with pytest.raises(AllocationError, match=r"request 'gpu'.*memory: needs 30Gi, 20Gi of 80Gi left"):
        allocate_on(claim(exactly(capacity={"memory": "30Gi"})), slices, allocated=allocated)
    [result] = results(allocate_on(claim(exactly(capacity={"memory": "20Gi"})), slices, allocated=allocated))
    assert result["device"] == "gpu-0"


def test_compute_oversubscription_is_refused():
    slices = [capacity_slice()]
    first = claim(exactly(capacity={"compute": "70"}))
    allocated = [with_status(first, allocate_on(first, slices))]
    with pytest.raises(AllocationError, match=r"compute: needs 40, 30 of 100 left"):
        allocate_on(claim(exactly(capacity={"compute": "40"})), slices, allocated=allocated)


def test_full_gpu_moves_on_to_the_next_one():
    slices = [capacity_slice(gpus=2)]
    first = claim(exactly(capacity={"memory": "70Gi"}))
    allocated = [with_status(first, allocate_on(first, slices))]
    [result] = results(allocate_on(claim(exactly(capacity={"memory": "70Gi"})), slices, allocated=allocated))
    assert result["device"] == "gpu-1"


def test_reallocating_a_claim_ignores_its_own_old_allocation():
    slices = [capacity_slice()]
    c = claim(exactly(capacity={"memory": "60Gi"}))
    allocated = [with_status(c, allocate_on(c, slices))]
    assert results(allocate_on(c, slices, allocated=allocated))[0]["device"] == "gpu-0"


def test_one_claim_two_requests_share_a_device_and_add_up():
    two = claim(exactly("a", capacity={"memory": "40Gi"}), exactly("b", capacity={"memory": "40Gi"}))
    assert [r["device"] for r in results(allocate_on(two, [capacity_slice()]))] == ["gpu-0", "gpu-0"]
    three = claim(*(exactly(n, capacity={"memory": "40Gi"}) for n in "abc"))
    with pytest.raises(AllocationError, match="each fits alone but not all together"):
        allocate_on(three, [capacity_slice()])


def test_count_needs_distinct_devices():
    with pytest.raises(AllocationError, match=r"request 'gpu': count 2 is more than the 1 matching device"):
        allocate_on(claim(exactly(count=2, capacity={"memory": "1Gi"})), [capacity_slice()])
    status = allocate_on(claim(exactly(count=2, capacity={"memory": "1Gi"})), [capacity_slice(gpus=2)])
    assert [r["device"] for r in results(status)] == ["gpu-0", "gpu-1"]
    assert len({r["shareID"] for r in results(status)}) == 2


def test_unknown_capacity_name_is_refused():
    with pytest.raises(AllocationError, match="has no capacity gpushare.dev/bandwidth"):
        allocate_on(claim(exactly(capacity={"bandwidth": "1"})), [capacity_slice()])


def test_qualified_capacity_request_name_matches():
    [result] = results(allocate_on(claim(exactly(capacity={"gpushare.dev/memory": "3Gi"})), [capacity_slice()]))
    assert result["consumedCapacity"]["memory"] == "3Gi"
