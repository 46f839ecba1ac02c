"""The cdi/ package: versions, file names, atomic writes, other vendors' specs."""

from __future__ import annotations

import os

import pytest

from cdi import ContainerEdits, Device, DeviceNode, Mount, Spec, SpecDir, find_devices_of_kind
from tests.support.cdi import assert_valid_cdi


def spec(name="abc-gpu-0", **edits):
    return Spec("k8s.gpushare.dev/claim", [Device(name, ContainerEdits(env=["A=1"]))], ContainerEdits(**edits))


def test_lowest_version():
    assert spec().required_version() == "0.3.0"
    assert spec(mounts=[Mount("/a", "/b", ["ro"], type="bind")]).required_version() == "0.4.0"
    assert spec("0bc-gpu-0").required_version() == "0.5.0"
    assert spec(device_nodes=[DeviceNode("/dev/x", host_path="/dev/y")]).required_version() == "0.5.0"
    assert Spec("a.b/c.d", [Device("x", ContainerEdits(env=["A=1"]))]).required_version() == "0.6.0"


def test_schema_rejects_a_bad_spec():
    assert_valid_cdi(spec(env=["B=2"], mounts=[Mount("/a", "/b")]).to_dict())
    with pytest.raises(AssertionError):
        assert_valid_cdi({"cdiVersion": "0.3.0", "devices": []})


def test_spec_dir_write_replace_remove(tmp_path):
    d = SpecDir(str(tmp_path / "cdi"), "k8s.gpushare.dev/claim")
    path = d.write("u1", spec())
    assert os.path.basename(path) == "k8s.gpushare.dev-claim_u1.json"
    d.write("u1", spec(env=["X=1"]))
    assert os.listdir(tmp_path / "cdi") == ["k8s.gpushare.dev-claim_u1.json"]  # no temp files left
    assert d.names() == {"u1"}
    assert d.remove("u1") and not d.remove("u1")


def test_find_toolkit_devices(tmp_path):
    (tmp_path / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n  containerEdits: {}\n"
        "- name: GPU-abc\n  containerEdits: {}\n- name: all\n  containerEdits: {}\n")
    (tmp_path / "broken.yaml").write_text("{{{")
    (tmp_path / "other.json").write_text('{"kind": "example.com/x", "devices": [{"name": "z"}]}')
    assert find_devices_of_kind([str(tmp_path), str(tmp_path / "missing")], "nvidia.com/gpu") == {"0", "GPU-abc", "all"}
