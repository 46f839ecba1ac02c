"""Pure slice building: names, attributes, capacities, splitting, comparison."""

import copy
from decimal import Decimal

import kubernetes_validate
import pytest
from kubernetes.utils import parse_quantity

from dra_driver import devicemodel
from dra_driver.controller import slices
from dra_driver.discovery import GpuInfo, MockBackend

GiB = 2**30


def gpus(n, memory="80Gi"):
    return MockBackend(f"{n}x{memory}").discover()


def build(n=2, mode="capacity", partitions=8, taints=True, gpu_list=None, node_uid="uid-1"):
    devices = slices.desired_devices(gpus(n) if gpu_list is None else gpu_list, mode, partitions, taints)
    return slices.desired_slices("node-a", "gpushare.dev", devices, node_uid)


def test_capacity_mode_one_device_per_gpu_with_request_policy():
    [s] = build(2, "capacity")
    assert [d["name"] for d in s["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    d = s["spec"]["devices"][0]
    assert d["allowMultipleAllocations"] is True
    memory, compute = d["capacity"]["memory"], d["capacity"]["compute"]
    assert parse_quantity(memory["value"]) == 80 * GiB
    assert memory["requestPolicy"]["validRange"] == {"min": "256Mi", "step": "256Mi", "max": "80Gi"}
    assert memory["requestPolicy"]["default"] == "10Gi"  # no memory ask: 1/8 (no compute ask: all of it)
    assert compute == {"value": "100", "requestPolicy": {"default": "100",
                                                         "validRange": {"min": "1", "step": "1", "max": "100"}}}


def test_capacity_mode_max_is_a_multiple_of_step_on_odd_memory():
    odd = [GpuInfo(0, "GPU-x", 0, "H100", 81559 * 2**20, "Hopper", "9.0", "580.65.06", "13.0")]
    [d] = build(gpu_list=odd)[0]["spec"]["devices"]
    policy = d["capacity"]["memory"]["requestPolicy"]
    assert parse_quantity(policy["validRange"]["max"]) % (256 * 2**20) == 0
    top = parse_quantity(policy["validRange"]["max"])
    assert top <= 81559 * 2**20 < top + 256 * 2**20
    assert policy["default"] == "9984Mi"  # 1/8 of 81559Mi, rounded down to the 256Mi step


@pytest.mark.parametrize("partitions,compute", [(8, Decimal("12.5")), (4, Decimal(25)), (3, Decimal("33.333"))])
def test_partition_mode_shares(partitions, compute):
    [s] = build(2, "partition", partitions)
    names = [d["name"] for d in s["spec"]["devices"]]
    assert names == [devicemodel.share_device(g, j) for g in range(2) for j in range(partitions)]
    d = s["spec"]["devices"][0]
    assert "allowMultipleAllocations" not in d
    gpu = gpus(1)[0]
    assert parse_quantity(d["capacity"]["memory"]["value"]) == devicemodel.share_memory(gpu, partitions)
    assert parse_quantity(d["capacity"]["compute"]["value"]) == compute
    assert "requestPolicy" not in d["capacity"]["memory"]


def test_attributes_per_contract():
    gpu = GpuInfo(3, "GPU-abc", 3, "NVIDIA H100 80GB HBM3", 80 * GiB, "Hopper", "9.0", "580.65.06", "13.0",
                  brand="Nvidia", pci_bus_id="0000:3b:00.0", pcie_root="pci0000:3a")
    for mode in ("capacity", "partition"):
        d = build(mode=mode, gpu_list=[gpu])[0]["spec"]["devices"][0]
        assert d["attributes"] == {
            "type": {"string": "gpu"}, "uuid": {"string": "GPU-abc"}, "index": {"int": 3},
            "productName": {"string": "NVIDIA H100 80GB HBM3"}, "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.65.6"}, "cudaDriverVersion": {"version": "13.0.0"},
            "pcieBusID": {"string": "0000:3b:00.0"}, "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"}, "sharing": {"string": mode},
            "sharingStrategy": {"string": "TimeSlicing"},  # what the GPU serves (--mps-gpus)
        }
        assert len(d["attributes"]) + len(d["capacity"]) <= 32  # the API's limit per device


def test_unknown_brand_and_pci_location_are_left_out():
    """A GPU whose brand or PCI address NVML, or whose root sysfs, does not tell has no such
    attribute (NVIDIA's driver skips pcieRoot the same way), rather than an empty string a
    selector would match."""
    gpu = GpuInfo(0, "GPU-abc", 0, "H100", 80 * GiB, "Hopper", "9.0", "580.65.06", "13.0", pci_bus_id="0000:3b:00.0")
    attributes = build(gpu_list=[gpu])[0]["spec"]["devices"][0]["attributes"]
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:3b:00.0"}
    assert "resource.kubernetes.io/pcieRoot" not in attributes
    gpu = GpuInfo(0, "GPU-abc", 0, "H100", 80 * GiB, "Hopper", "9.0", "580.65.06", "13.0")
    attributes = build(gpu_list=[gpu])[0]["spec"]["devices"][0]["attributes"]
    assert not {"brand", "pcieBusID", "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot"} & set(
        attributes)


@pytest.mark.parametrize("text,version", [("9.0", "9.0.0"), ("580.65.06", "580.65.6"), ("580", "580.0.0"),
                                          ("12.2.140-beta", "12.2.140"), ("garbage", "0.0.0")])
def test_semver(text, version):
    assert slices.semver(text) == version


def test_taint_value_is_a_label_value():
    value = slices.taint_value("NVML cannot open GPU 0: Unknown Error (XID 79) -- fell off the bus!!!")
    assert len(value) <= 63 and value[0].isalnum() and value[-1].isalnum()
    assert set(value) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
    assert slices.taint_value("") == "Unhealthy"


def test_unhealthy_gpu_tainted_or_left_out():
    gpu_list = [gpus(2)[0], GpuInfo(**{**gpus(2)[1].__dict__, "healthy": False, "health_reason": "XID 79"})]
    tainted = {d["name"]: d for d in build(gpu_list=gpu_list, taints=True)[0]["spec"]["devices"]}
    assert tainted["gpu-1"]["taints"] == [{"key": "gpushare.dev/unhealthy", "value": "XID-79", "effect": "NoSchedule"}]
    assert "taints" not in tainted["gpu-0"]
    left_out = build(gpu_list=gpu_list, taints=False)[0]["spec"]["devices"]
    assert [d["name"] for d in left_out] == ["gpu-0"]


def test_gpu_without_readable_memory_is_not_published():
    lost = GpuInfo(0, "unknown-0", 0, "unknown", 0, "unknown", "0.0", "580.0", "13.0", healthy=False)
    assert build(gpu_list=[lost])[0]["spec"]["devices"] == []


def test_split_at_128_devices():
    out = build(200, "capacity")
    assert [len(s["spec"]["devices"]) for s in out] == [128, 72]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in out} == {2}
    assert [s["metadata"]["name"] for s in out] == ["node-a-gpushare.dev-0", "node-a-gpushare.dev-1"]
    names = [d["name"] for s in out for d in s["spec"]["devices"]]
    assert names == [f"gpu-{i}" for i in range(200)]


def test_split_at_64_devices_with_taints():
    gpu_list = gpus(100)
    gpu_list[5] = GpuInfo(**{**gpu_list[5].__dict__, "healthy": False})
    out = build(gpu_list=gpu_list, taints=True)
    assert [len(s["spec"]["devices"]) for s in out] == [64, 36]


def test_empty_node_still_has_one_slice():
    [s] = build(gpu_list=[])
    assert s["spec"]["devices"] == [] and s["spec"]["pool"]["resourceSliceCount"] == 1


def test_slice_metadata():
    [s] = build(1)
    assert s["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "node-a",
                                                 "uid": "uid-1", "controller": True}]
    assert s["spec"]["nodeName"] == "node-a" and s["spec"]["pool"]["name"] == "node-a"
    assert "ownerReferences" not in build(1, node_uid=None)[0]["metadata"]


def test_long_node_names_give_valid_slice_names():
    node = ".".join(["a" * 60] * 4)  # 243 characters, a valid node name
    name = slices.slice_name(node, "gpushare.dev", 0)
    assert len(name) <= 253 and name != slices.slice_name(node + "b", "gpushare.dev", 0)


def test_content_ignores_server_forms():
    [want] = build(1, "partition", 8, gpu_list=[GpuInfo(**{**gpus(1)[0].__dict__, "healthy": False})])
    server = copy.deepcopy(slices.with_generation(want, 7))
    server["metadata"] = {**want["metadata"], "resourceVersion": "9", "uid": "u", "creationTimestamp": "now"}
    for d in server["spec"]["devices"]:
        d["capacity"]["compute"]["value"] = "12.5"  # same quantity, other spelling
        d["capacity"]["memory"]["value"] = str(80 * GiB // 8)
        d["taints"] = [{**d["taints"][0], "timeAdded": "2026-11-22T00:00:00Z"}]
    server["spec"]["devices"].reverse()
    assert slices.in_sync([want], [server])
    server["spec"]["devices"][0]["capacity"]["compute"]["value"] = "13"
    assert not slices.in_sync([want], [server])


def test_in_sync_needs_one_generation_and_no_extras():
    want = build(200)
    a, b = slices.with_generation(want[0], 3), slices.with_generation(want[1], 3)
    assert slices.in_sync(want, [a, b])
    assert not slices.in_sync(want, [a, slices.with_generation(want[1], 4)])
    assert not slices.in_sync(want, [a])
    extra = slices.with_generation({**want[1], "metadata": {"name": "other"}}, 3)
    assert not slices.in_sync(want, [a, b, extra])


def test_kept_features():
    probe = slices.probe_slice("node-a", "gpushare.dev")
    assert slices.kept_features(probe, probe) == (True, True)
    stripped = {"spec": {"devices": [{"name": d["name"]} for d in probe["spec"]["devices"]]}}
    assert slices.kept_features(probe, stripped) == (False, False)
    assert slices.kept_features(build(1, "partition")[0], build(1, "partition")[0]) == (None, None)


@pytest.mark.parametrize("kube_version", ["1.34", kubernetes_validate.utils.latest_version()])
@pytest.mark.parametrize("mode", ["capacity", "partition"])
def test_built_slices_valid_against_upstream_schema(kube_version, mode):
    gpu_list = gpus(3)
    gpu_list[1] = GpuInfo(**{**gpu_list[1].__dict__, "healthy": False, "health_reason": "XID 79"})
    for s in build(gpu_list=gpu_list, mode=mode) + [slices.probe_slice("node-a", "gpushare.dev")]:
        kubernetes_validate.validate(slices.with_generation(s, 1), kube_version, strict=True)
