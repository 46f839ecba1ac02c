"""Binpack and spread: the order the controller publishes devices in decides where the
scheduler's first-fit allocator puts claims (issue 19). The slices are the controller's own
(desired_devices/desired_slices on mock GPUs), the class is the shipped DeviceClass, and the
stand-in tries devices as the 1.36 allocator does: slices by name, devices in slice order."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dra_driver.controller.slices import desired_devices, desired_slices
from dra_driver.devicemodel import BINPACK, CAPACITY, PARTITION, SPREAD
from dra_driver.discovery import MockBackend
from tests.support.shapes import NODE, allocate_on, capacity_slice, claim, exactly, results, with_status

DRIVER = "gpushare.dev"
CLASSES = [d for d in yaml.safe_load_all((Path(__file__).parents[2] / "deploy/base/deviceclass.yaml").read_text())
           if d and d.get("kind") == "DeviceClass"]


def node_slices(mode: str, order: str, gpus: str = "4x80Gi", partitions: int = 4) -> list[dict]:
    devices = desired_devices(MockBackend(gpus).discover(), mode, partitions, taints=True, order=order)
    return desired_slices(NODE, DRIVER, devices, None)


def place(slices: list[dict], n: int, request: dict | None = None) -> list[str]:
    """Allocate n one-device claims one after another, as the scheduler would; their devices."""
    allocated, devices = [], []
    for i in range(n):
        c = claim(request or exactly(), name=f"c{i}")
        status = allocate_on(c, slices, classes=CLASSES, allocated=allocated)
        allocated.append(with_status(c, status))
        devices += [r["device"] for r in results(status)]
    return devices


def gpu_of(device: str) -> str:
    return "-".join(device.split("-")[:2])


def test_binpack_puts_four_claims_on_one_gpu():
    devices = place(node_slices(PARTITION, BINPACK), 4)
    assert devices == ["gpu-0-share-0", "gpu-0-share-1", "gpu-0-share-2", "gpu-0-share-3"]


def test_spread_puts_four_claims_on_four_gpus():
    devices = place(node_slices(PARTITION, SPREAD), 4)
    assert devices == ["gpu-0-share-0", "gpu-1-share-0", "gpu-2-share-0", "gpu-3-share-0"]


def test_spread_doubles_up_only_when_every_gpu_has_a_claim():
    assert [gpu_of(d) for d in place(node_slices(PARTITION, SPREAD), 6)] == \
        ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-0", "gpu-1"]


def test_capacity_mode_packs_whatever_the_order():
    """One device per GPU with consumable capacity: the first GPU with room takes each claim."""
    request = exactly(capacity={"memory": "8Gi", "compute": "10"})
    for order in (BINPACK, SPREAD):
        assert {gpu_of(d) for d in place(node_slices(CAPACITY, order), 4, request)} == {"gpu-0"}


def test_spread_keeps_every_device_once():
    binpack = desired_devices(MockBackend("3x16Gi").discover(), PARTITION, 5, taints=True, order=BINPACK)
    spread = desired_devices(MockBackend("3x16Gi").discover(), PARTITION, 5, taints=True, order=SPREAD)
    assert sorted(d["name"] for d in spread) == sorted(d["name"] for d in binpack) and len(spread) == 15


def test_an_unknown_order_is_refused():
    with pytest.raises(ValueError, match="order: 'random' is not one of binpack, spread"):
        desired_devices(MockBackend("1x16Gi").discover(), PARTITION, 2, taints=True, order="random")


def test_the_allocator_tries_slices_by_name_not_by_list_order():
    """Two slices of one pool listed out of name order: the device of the slice named first wins."""
    later = capacity_slice(name=f"{NODE}-{DRIVER}-1", slice_count=2)
    later["spec"]["devices"][0]["name"] = "gpu-1"
    first = capacity_slice(name=f"{NODE}-{DRIVER}-0", slice_count=2)
    [result] = results(allocate_on(claim(exactly(capacity={"memory": "1Gi"})), [later, first]))
    assert result["device"] == "gpu-0"
