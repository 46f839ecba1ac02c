"""CEL selectors from the claim and the DeviceClass, on cel-python."""

import pytest

from playground.allocator import AllocationError
from playground.claims import DRIVER
from tests.support.shapes import (
    allocate_on,
    capacity_device,
    capacity_slice,
    claim,
    device_class,
    exactly,
    resource_slice,
    results,
)

MIXED = [resource_slice([capacity_device(0, memory="40Gi", product="NVIDIA A100-SXM4-40GB"),
                         capacity_device(1, memory="80Gi", product="NVIDIA H100 80GB HBM3")])]


def _picked(*selectors, classes=None):
    return [r["device"] for r in results(allocate_on(claim(exactly(selectors=selectors)), MIXED, classes=classes))]


def test_product_name_selector():
    assert _picked('device.attributes["gpushare.dev"].productName.startsWith("NVIDIA H100")') == ["gpu-1"]


def test_memory_capacity_as_number():
    assert _picked('device.capacity["gpushare.dev"].memory >= 68719476736') == ["gpu-1"]


def test_memory_capacity_with_quantity_compare_to():
    assert _picked('device.capacity["gpushare.dev"].memory.compareTo(quantity("64Gi")) >= 0') == ["gpu-1"]
    assert _picked('device.capacity["gpushare.dev"].memory.isLessThan(quantity("64Gi"))') == ["gpu-0"]


def test_int_bool_and_version_attributes():
    assert _picked('device.attributes["gpushare.dev"].index == 1 && device.allowMultipleAllocations') == ["gpu-1"]
    assert _picked('device.attributes["gpushare.dev"].cudaComputeCapability == semver("9.0.0")') == ["gpu-0"]
    assert _picked('device.attributes["gpushare.dev"].driverVersion.isGreaterThan(semver("535.0.0"))') == ["gpu-0"]
    assert _picked('device.attributes["gpushare.dev"].cudaComputeCapability.major() >= 9') == ["gpu-0"]


def test_class_selector_on_driver():
    other = device_class(name="other", selectors=['device.driver == "other.example.com"'])
    with pytest.raises(AllocationError, match=r"request 'gpu': no device on the node matches device class 'other'"):
        allocate_on(claim(exactly(device_class_name="other")), MIXED, classes=[other])


def test_the_message_says_what_the_class_selects():
    """`gpushare.dev/share: 2` on a capacity-mode node: the class's selector says partition mode is needed."""
    share = device_class(name="share.gpushare.dev", selectors=[
        'device.driver == "gpushare.dev" && device.attributes["gpushare.dev"].sharing == "partition"'])
    with pytest.raises(AllocationError, match=r"matches device class 'share.gpushare.dev' \(device.driver == "
                                              r"\"gpushare.dev\" && device.attributes\[\"gpushare.dev\"\].sharing "
                                              r"== \"partition\"\) and the request's selectors"):
        allocate_on(claim(exactly(device_class_name="share.gpushare.dev")), [capacity_slice(2)], classes=[share])
    assert _picked(classes=[device_class()]) == ["gpu-0"]


def test_class_and_claim_selectors_must_both_hold():
    h100_class = device_class(name="h100", selectors=[f'device.driver == "{DRIVER}"',
                                                      'device.attributes["gpushare.dev"].productName.contains("H100")'])
    c = claim(exactly(device_class_name="h100", selectors=['device.attributes["gpushare.dev"].index == 1']))
    assert results(allocate_on(c, MIXED, classes=[h100_class]))[0]["device"] == "gpu-1"
    c = claim(exactly(device_class_name="h100", selectors=['device.attributes["gpushare.dev"].index == 0']))
    with pytest.raises(AllocationError, match="no device on the node matches"):
        allocate_on(c, MIXED, classes=[h100_class])


def test_bad_attribute_name_matches_nothing():
    with pytest.raises(AllocationError, match=r"request 'gpu': no device on the node matches"):
        _picked('device.attributes["gpushare.dev"].productname == "x"')


def test_unknown_domain_is_an_empty_map():
    assert _picked('!("model" in device.attributes["other.example.com"])') == ["gpu-0"]
    with pytest.raises(AllocationError, match="no device on the node matches"):
        _picked('device.attributes["other.example.com"].model == "x"')


def test_qualified_attribute_in_another_domain():
    slices = [resource_slice([capacity_device(0)])]
    slices[0]["spec"]["devices"][0]["attributes"]["example.com/rack"] = {"string": "r1"}
    c = claim(exactly(selectors=['device.attributes["example.com"].rack == "r1"']))
    assert results(allocate_on(c, slices))[0]["device"] == "gpu-0"


def test_syntax_and_type_errors_are_reported():
    with pytest.raises(AllocationError, match=r"request 'gpu': invalid CEL expression"):
        _picked('device.driver ==')
    with pytest.raises(AllocationError, match=r"request 'gpu': CEL expression .* failed on device gpu-0"):
        _picked('device.attributes["gpushare.dev"].index + "x" == 1')
    with pytest.raises(AllocationError, match="not a bool"):
        _picked('device.driver')
