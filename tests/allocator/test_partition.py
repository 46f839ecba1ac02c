"""Partition mode: N exclusive share devices per GPU; constraints keep shares on one GPU."""

import pytest

from playground.allocator import AllocationError
from tests.support.shapes import (
    allocate_on,
    claim,
    exactly,
    partition_devices,
    partition_slice,
    resource_slice,
    results,
    with_status,
)

SAME_GPU = [{"matchAttribute": "gpushare.dev/uuid"}]


def _taken(devices, slices):
    """A claim already holding exactly these devices."""
    holder = claim(exactly(count=len(devices)))
    return with_status(holder, {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpushare.dev", "pool": "node-1", "device": d} for d in devices]}}})


def test_share_device_has_no_share_id_or_consumed_capacity():
    [result] = results(allocate_on(claim(exactly()), [partition_slice()]))
    assert result == {"request": "gpu", "driver": "gpushare.dev", "pool": "node-1", "device": "gpu-0-share-0"}


def test_two_shares_of_one_gpu():
    status = allocate_on(claim(exactly(count=2), constraints=SAME_GPU), [partition_slice(gpus=2)])
    assert [r["device"] for r in results(status)] == ["gpu-0-share-0", "gpu-0-share-1"]


def test_constraint_backtracks_when_first_gpu_has_one_free_share():
    slices = [partition_slice(gpus=2)]
    allocated = [_taken([f"gpu-0-share-{j}" for j in range(7)], slices)]
    status = allocate_on(claim(exactly(count=2), constraints=SAME_GPU), slices, allocated=allocated)
    assert [r["device"] for r in results(status)] == ["gpu-1-share-0", "gpu-1-share-1"]


def test_constraint_across_two_requests_backtracks_the_first_request():
    slices = [partition_slice(gpus=2)]
    allocated = [_taken([f"gpu-0-share-{j}" for j in range(7)], slices)]
    c = claim(exactly("a"), exactly("b"), constraints=[{"requests": ["a", "b"], "matchAttribute": "gpushare.dev/uuid"}])
    assert [r["device"] for r in results(allocate_on(c, slices, allocated=allocated))] == \
        ["gpu-1-share-0", "gpu-1-share-1"]


def test_without_constraint_shares_may_span_gpus():
    slices = [partition_slice(gpus=2)]
    allocated = [_taken([f"gpu-0-share-{j}" for j in range(7)], slices)]
    status = allocate_on(claim(exactly(count=2)), slices, allocated=allocated)
    assert [r["device"] for r in results(status)] == ["gpu-0-share-7", "gpu-1-share-0"]


def test_unsatisfiable_constraint_is_named():
    slices = [partition_slice(gpus=2)]
    allocated = [_taken([f"gpu-{i}-share-{j}" for i in range(2) for j in range(7)], slices)]
    with pytest.raises(AllocationError, match=r"request 'gpu': no set of devices satisfies matchAttribute "
                                              r"'gpushare.dev/uuid'"):
        allocate_on(claim(exactly(count=2), constraints=SAME_GPU), slices, allocated=allocated)


def test_distinct_attribute_spreads_over_gpus():
    c = claim(exactly(count=2), constraints=[{"distinctAttribute": "gpushare.dev/uuid"}])
    assert [r["device"] for r in results(allocate_on(c, [partition_slice(gpus=2)]))] == \
        ["gpu-0-share-0", "gpu-1-share-0"]


def test_exclusive_device_used_by_another_claim_is_refused():
    slices = [resource_slice(partition_devices(0, shares=2))]
    allocated = [_taken(["gpu-0-share-0", "gpu-0-share-1"], slices)]
    with pytest.raises(AllocationError, match=r"request 'gpu': needs 1 device\(s\), only 0 of 2 matching device\(s\) "
                                              r"can take it: allocated to another claim \(2 devices: gpu-0-share-0, "
                                              r"gpu-0-share-1\)"):
        allocate_on(claim(exactly()), slices, allocated=allocated)


def test_exclusive_device_not_picked_twice_within_a_claim():
    slices = [resource_slice(partition_devices(0, shares=2))]
    c = claim(exactly("a"), exactly("b"))
    assert [r["device"] for r in results(allocate_on(c, slices))] == ["gpu-0-share-0", "gpu-0-share-1"]
    with pytest.raises(AllocationError, match="not all together"):
        allocate_on(claim(exactly("a"), exactly("b"), exactly("c")), slices)


def test_the_cause_leads_however_many_devices_a_node_has():
    """Per-device reasons are grouped, the most common first: with 16 shares taken the message
    still says why (it listed the first 4 devices and was cut off before the cause)."""
    slices = [partition_slice(gpus=2, shares=8)]
    allocated = [_taken([f"gpu-{g}-share-{j}" for g in range(2) for j in range(8)], slices)]
    with pytest.raises(AllocationError, match=r"only 0 of 16 matching device\(s\) can take it: allocated to another "
                                              r"claim \(16 devices: gpu-0-share-0, gpu-0-share-1, gpu-0-share-2, "
                                              r"\.\.\.\)$"):
        allocate_on(claim(exactly()), slices, allocated=allocated)


def test_capacity_request_filters_exclusive_devices():
    # A share has 10Gi; asking for more makes it unfit, asking for less takes the whole share.
    [result] = results(allocate_on(claim(exactly(capacity={"memory": "4Gi"})), [partition_slice()]))
    assert "consumedCapacity" not in result
    with pytest.raises(AllocationError, match="memory 11Gi is more than the device has"):
        allocate_on(claim(exactly(capacity={"memory": "11Gi"})), [partition_slice()])


def test_allocation_mode_all_takes_every_matching_device():
    status = allocate_on(claim(exactly(mode="All", selectors=['device.attributes["gpushare.dev"].index == 1'])),
                         [partition_slice(gpus=2, shares=4)])
    assert [r["device"] for r in results(status)] == [f"gpu-1-share-{j}" for j in range(4)]


def test_allocation_mode_all_fails_when_one_is_taken():
    slices = [partition_slice(shares=4)]
    allocated = [_taken(["gpu-0-share-2"], slices)]
    with pytest.raises(AllocationError, match=r"allocationMode All needs every matching device, but allocated to "
                                              r"another claim \(gpu-0-share-2\)"):
        allocate_on(claim(exactly(mode="All")), slices, allocated=allocated)


def test_allocation_mode_all_with_no_device_fails():
    with pytest.raises(AllocationError, match="no device on the node matches"):
        allocate_on(claim(exactly(mode="All", selectors=['device.attributes["gpushare.dev"].index == 5'])),
                    [partition_slice()])


def test_incomplete_pool_is_not_allocated_from():
    """As upstream's allocator (1.37): All fails naming the pool, ExactCount finds nothing in it."""
    slices = [partition_slice(shares=2, slice_count=2)]
    with pytest.raises(AllocationError, match="is currently being updated"):
        allocate_on(claim(exactly(mode="All")), slices)
    with pytest.raises(AllocationError, match="no device on the node matches"):
        allocate_on(claim(exactly()), slices)
