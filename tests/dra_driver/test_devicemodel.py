"""devicemodel: every device name the contract promises (docs/contract.md), built and parsed
in one place, and the names it refuses."""

from __future__ import annotations

import re

import pytest

from dra_driver.devicemodel import DeviceRef, cdi_device_name, parse_device_name, share_device, whole_gpu_device

UID = "6b1e3c2a-9f0d-4e5b-8a7c-1d2e3f405162"
SHARE = "e2f26c2c-2c86-4087-a20a-54104cf3b0ad"


def test_capacity_mode_names_one_device_per_gpu():
    assert whole_gpu_device(0) == "gpu-0" and whole_gpu_device(13) == "gpu-13"
    assert parse_device_name("gpu-13") == DeviceRef(13, None)


def test_partition_mode_names_shares():
    assert share_device(2, 7) == "gpu-2-share-7"
    assert parse_device_name("gpu-2-share-7") == DeviceRef(2, 7)


@pytest.mark.parametrize("index", [0, 1, 9, 10, 127, 999_999])
@pytest.mark.parametrize("share", [0, 1, 63, 9_999])
def test_every_built_name_parses_back(index, share):
    assert parse_device_name(whole_gpu_device(index)) == DeviceRef(index, None)
    assert parse_device_name(share_device(index, share)) == DeviceRef(index, share)


@pytest.mark.parametrize("index,share,bad", [
    (-1, 0, "GPU index"), (1_000_000, 0, "GPU index"), (1, -1, "share"), (1, 10_000, "share"),
    (True, 0, "GPU index"), (1.0, 0, "GPU index"), ("1", 0, "GPU index"),
])
def test_builders_refuse_what_the_parser_would_not_read_back(index, share, bad):
    got = re.escape(repr(share if bad == "share" else index))
    with pytest.raises(ValueError, match=f"^{bad} must be an integer from 0 to [0-9]+ \\(got {got}\\)$"):
        share_device(index, share)
    if bad == "GPU index":
        with pytest.raises(ValueError, match="^GPU index must be"):
            whole_gpu_device(index)


def test_cdi_device_name_is_claim_uid_device_and_share_id():
    assert cdi_device_name(UID, "gpu-1") == f"{UID}-gpu-1"
    assert cdi_device_name(UID, "gpu-1", SHARE) == f"{UID}-gpu-1-{SHARE}"
    assert cdi_device_name(UID, "gpu-0-share-3", None) == f"{UID}-gpu-0-share-3"


@pytest.mark.parametrize("name", [
    "", "gpu", "gpu-", "gpu-x", "gpu-01", "gpu--1", "gpu-1-", "gpu-1-share", "gpu-1-share-", "gpu-1-share-01",
    "gpu-1-share-x", "gpu-1-2", "gpu-1-share-1-share-2", "GPU-1", " gpu-1", "gpu-1 ", "gpu-1\n", "gpu-1-share-1\n",
    "gpu-1234567", "gpu-1-share-12345", "cpu-1", f"{UID}-gpu-1", "gpu-１",
    None, 1, ["gpu-1"], b"gpu-1",
])
def test_anything_else_is_not_a_device_of_ours(name):
    assert parse_device_name(name) is None
