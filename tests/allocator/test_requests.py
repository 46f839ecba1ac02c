"""Request forms, configs, taints, pool generations and refusals."""

import pytest

from playground.allocator import AllocationError
from tests.support.shapes import (
    allocate_on,
    capacity_device,
    capacity_slice,
    claim,
    device_class,
    exactly,
    first_available,
    opaque,
    partition_slice,
    resource_slice,
    results,
    subrequest,
)


def test_first_available_falls_back_to_the_second_subrequest():
    c = claim(first_available("gpu", subrequest("big", capacity={"memory": "100Gi"}),
                              subrequest("small", capacity={"memory": "20Gi"})))
    [result] = results(allocate_on(c, [capacity_slice()]))
    assert result["request"] == "gpu/small"
    assert result["consumedCapacity"]["memory"] == "20Gi"


def test_first_available_prefers_the_first_subrequest():
    c = claim(first_available("gpu", subrequest("two", count=2), subrequest("one")))
    assert [r["request"] for r in results(allocate_on(c, [partition_slice()]))] == ["gpu/two", "gpu/two"]


def test_first_available_none_fits_lists_every_reason():
    c = claim(first_available("gpu", subrequest("big", capacity={"memory": "100Gi"}),
                              subrequest("many", count=3)))
    with pytest.raises(AllocationError, match=r"request 'gpu': no subrequest can be satisfied: gpu/big: .*memory "
                                              r"100Gi is above.*; gpu/many: count 3 is more than the 1"):
        allocate_on(c, [capacity_slice()])


def test_class_config_comes_before_claim_config_with_request_scoping():
    cls = device_class(config=[opaque(fromClass=True)])
    c = claim(exactly("a"), exactly("b"),
              config=[{"requests": ["b"], **opaque(forB=True)}, opaque(forAll=True)])
    config = allocate_on(c, [capacity_slice()], classes=[cls])["allocation"]["devices"]["config"]
    assert config == [
        {"source": "FromClass", "requests": ["a"], **opaque(fromClass=True)},
        {"source": "FromClass", "requests": ["b"], **opaque(fromClass=True)},
        {"source": "FromClaim", "requests": ["b"], **opaque(forB=True)},
        {"source": "FromClaim", **opaque(forAll=True)},
    ]


def test_config_for_an_unchosen_subrequest_is_dropped():
    c = claim(first_available("gpu", subrequest("big", capacity={"memory": "100Gi"}), subrequest("small")),
              config=[{"requests": ["gpu/big"], **opaque(big=True)}, {"requests": ["gpu/small"], **opaque(small=True)},
                      {"requests": ["gpu"], **opaque(any=True)}])
    config = allocate_on(c, [capacity_slice()], classes=[device_class(config=[opaque(cls=True)])])
    assert config["allocation"]["devices"]["config"] == [
        {"source": "FromClass", "requests": ["gpu/small"], **opaque(cls=True)},
        {"source": "FromClaim", "requests": ["gpu/small"], **opaque(small=True)},
        {"source": "FromClaim", "requests": ["gpu"], **opaque(any=True)},
    ]


TAINT = {"key": "gpushare.dev/unhealthy", "value": "xid-79", "effect": "NoSchedule"}


def _tainted_first():
    return [resource_slice([capacity_device(0, taints=[TAINT]), capacity_device(1)])]


def test_tainted_device_is_skipped():
    assert results(allocate_on(claim(exactly()), _tainted_first()))[0]["device"] == "gpu-1"


@pytest.mark.parametrize("toleration", [
    {"key": "gpushare.dev/unhealthy", "operator": "Exists"},
    {"key": "gpushare.dev/unhealthy", "value": "xid-79", "effect": "NoSchedule"},
    {"operator": "Exists"},
])
def test_tolerated_taint_is_allowed(toleration):
    [result] = results(allocate_on(claim(exactly(tolerations=[toleration])), _tainted_first()))
    assert result["device"] == "gpu-0"
    assert result["tolerations"] == [toleration]


def test_wrong_toleration_does_not_help_and_error_names_the_taint():
    slices = [resource_slice([capacity_device(0, taints=[TAINT])])]
    wrong = [{"key": "gpushare.dev/unhealthy", "value": "other"}, {"operator": "Exists", "effect": "NoExecute"}]
    with pytest.raises(AllocationError, match=r"1 matching device\(s\) are tainted and not tolerated "
                                              r"\(gpu-0: gpushare.dev/unhealthy=xid-79:NoSchedule\)"):
        allocate_on(claim(exactly(tolerations=wrong)), slices)


def test_taint_with_other_effect_does_not_block():
    slices = [resource_slice([capacity_device(0, taints=[{**TAINT, "effect": "None"}])])]
    assert results(allocate_on(claim(exactly()), slices))[0]["device"] == "gpu-0"


def test_older_pool_generation_is_ignored():
    old = capacity_slice(gpus=2, generation=1)
    new = resource_slice([capacity_device(5)], generation=2)
    status = allocate_on(claim(exactly(mode="All")), [old, new])
    assert [r["device"] for r in results(status)] == ["gpu-5"]


def test_other_nodes_slices_are_ignored():
    slices = [capacity_slice(node="node-2"), capacity_slice(node="node-1", gpus=0)]
    with pytest.raises(AllocationError, match=r"on node 'node-1': request 'gpu': no device on the node matches .* "
                                              r"\(0 devices on the node\)"):
        allocate_on(claim(exactly()), slices)
    assert results(allocate_on(claim(exactly()), slices, node="node-2"))[0]["pool"] == "node-2"


def test_slice_found_by_pool_name_without_node_name():
    s = capacity_slice()
    del s["spec"]["nodeName"]
    s["spec"]["allNodes"] = True
    assert results(allocate_on(claim(exactly()), [s]))[0]["device"] == "gpu-0"


def test_unknown_device_class_is_refused():
    with pytest.raises(AllocationError, match=r"request 'gpu': device class 'nope' not found"):
        allocate_on(claim(exactly(device_class_name="nope")), [capacity_slice()])


def test_missing_device_class_name_is_refused():
    c = claim(exactly())
    del c["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
    with pytest.raises(AllocationError, match=r"request 'gpu': no deviceClassName"):
        allocate_on(c, [capacity_slice()])


def test_results_follow_request_order_and_error_names_the_claim():
    c = claim(exactly("first", capacity={"memory": "1Gi"}), exactly("second", capacity={"memory": "2Gi"}),
              name="two", namespace="team")
    assert [r["request"] for r in results(allocate_on(c, [capacity_slice()]))] == ["first", "second"]
    with pytest.raises(AllocationError, match=r"^cannot allocate claim team/two on node 'node-1': request 'second'"):
        allocate_on(claim(exactly("first"), exactly("second", count=2), name="two", namespace="team"),
                    [capacity_slice()])


def test_claim_without_requests_allocates_nothing():
    status = allocate_on(claim(), [capacity_slice()])
    assert status["allocation"]["devices"] == {"results": [], "config": []}




def test_bad_slice_quantity_is_reported():
    s = capacity_slice()
    s["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    with pytest.raises(AllocationError, match="unusable ResourceSlice: invalid quantity 'lots'"):
        allocate_on(claim(exactly()), [s])
