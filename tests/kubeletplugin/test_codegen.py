"""The generated gRPC stubs are current, and match the kubelet's published interface."""

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
STUBS = ROOT / "kubeletplugin/grpcapi"


def test_stubs_are_not_stale(tmp_path):
    subprocess.run([str(ROOT / "hack/update-codegen.sh"), str(tmp_path)], check=True,
                   env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}, capture_output=True)
    generated = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(p.name for p in STUBS.iterdir() if p.suffix in (".py", ".pyi"))
    assert generated == committed
    _, mismatch, errors = filecmp.cmpfiles(tmp_path, STUBS, generated, shallow=False)
    assert not mismatch and not errors, f"stale stubs: run hack/update-codegen.sh ({mismatch + errors})"


def test_services_and_fields_match_the_kubelet():
    from kubeletplugin.grpcapi import dra_v1_pb2, dra_v1beta1_pb2, pluginregistration_pb2

    v1 = dra_v1_pb2.DESCRIPTOR
    assert v1.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    methods = v1.services_by_name["DRAPlugin"].methods_by_name
    assert set(methods) == {"NodePrepareResources", "NodeUnprepareResources"}
    device = v1.message_types_by_name["Device"]
    assert {f.name: f.number for f in device.fields} == {
        "request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4, "share_id": 5}
    assert device.fields_by_name["share_id"].has_presence  # `optional`
    claim = v1.message_types_by_name["Claim"]
    assert {f.name: f.number for f in claim.fields} == {"namespace": 1, "uid": 2, "name": 3}
    resp = v1.message_types_by_name["NodePrepareResourcesResponse"].fields_by_name["claims"]
    assert resp.message_type.GetOptions().map_entry

    beta = dra_v1beta1_pb2.DESCRIPTOR
    assert beta.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    assert "share_id" not in beta.message_types_by_name["Device"].fields_by_name

    reg = pluginregistration_pb2.DESCRIPTOR
    assert reg.package == "pluginregistration"
    info = reg.message_types_by_name["PluginInfo"]
    assert {f.name: f.number for f in info.fields} == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
