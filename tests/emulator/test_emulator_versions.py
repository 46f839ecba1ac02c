"""The emulator per Kubernetes release: the default release, each release's default feature gates
(the fields a server of that release keeps or drops), and a pod's allocatedResourcesStatus (KEP-4680)."""

import json

import pytest
from kubernetes import client

from playground.emulator import ApiEmulator
from playground.emulator.features import default_gates
from playground.emulator.validation import available_kube_versions
from tests.support.emulator import claim_body, slice_body


def test_default_version_is_the_newest_with_schemas():
    assert available_kube_versions()[-1] == "1.37"  # kubernetes-validate>=1.37 (pyproject.toml)
    emu = ApiEmulator()
    assert emu.validator.kube_version == "1.37"
    assert all(emu.gates.values())  # every gate the emulator models is on in 1.37


@pytest.mark.parametrize("version, off", [
    ("1.34", {"DRAConsumableCapacity", "DRADeviceTaints", "DRAPartitionableDevices", "DRAExtendedResource",
              "ResourceHealthStatus"}),
    ("1.35", {"DRAConsumableCapacity", "DRADeviceTaints", "DRAPartitionableDevices", "DRAExtendedResource",
              "ResourceHealthStatus"}),
    ("1.36", set()),
    ("1.37", set()),
])
def test_default_gates_per_release(version, off):
    gates = default_gates(version)
    assert {g for g, on in gates.items() if not on} == off
    assert gates["DRAPrioritizedList"]  # beta since 1.34


def capacity_slice():
    return slice_body(devices=[{"name": "gpu-0", "allowMultipleAllocations": True,
                                "taints": [{"key": "k", "effect": "NoSchedule"}],
                                "capacity": {"memory": {"value": "80Gi"}}}])


def test_release_sets_what_is_kept_and_a_flag_overrides(make_emulator):
    old = client.ResourceV1Api(make_emulator(kube_version="1.35").api_client())
    device = old.create_resource_slice(capacity_slice()).spec.devices[0]
    assert device.allow_multiple_allocations is None and device.taints is None
    assert old.create_namespaced_resource_claim(
        "ns1", claim_body(capacity={"memory": "4Gi"})).spec.devices.requests[0].exactly.capacity is None

    gated = client.ResourceV1Api(make_emulator(kube_version="1.35", consumable_capacity=True).api_client())
    device = gated.create_resource_slice(capacity_slice()).spec.devices[0]
    assert device.allow_multiple_allocations is True and device.taints is None

    new = client.ResourceV1Api(make_emulator(kube_version="1.36").api_client())
    device = new.create_resource_slice(capacity_slice()).spec.devices[0]
    assert device.allow_multiple_allocations is True and device.taints[0].key == "k"


def test_extended_resource_name_dropped_before_136(make_emulator):
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "c"},
            "spec": {"extendedResourceName": "gpushare.dev/share"}}
    for version, kept in (("1.35", None), ("1.36", "gpushare.dev/share")):
        resource = client.ResourceV1Api(make_emulator(kube_version=version).api_client())
        assert resource.create_device_class(body).spec.extended_resource_name == kept


def health_pod():
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"resourceClaims": [{"name": "share", "resourceClaimName": "c"}],
                     "containers": [{"name": "main", "image": "x",
                                     "resources": {"claims": [{"name": "share", "request": "gpu"}]}}]}}


def report(core, entries):
    status = {"containerStatuses": [{"name": "main", "image": "x", "imageID": "", "ready": True, "restartCount": 0,
                                     "allocatedResourcesStatus": entries}]}
    return core.patch_namespaced_pod_status("p", "default", {"status": status}, _preload_content=False).json()


GOOD = [{"name": "claim:share/gpu", "resources": [{"resourceID": "k8s.gpushare.dev/claim=x", "health": "Unhealthy"}]}]


def test_allocated_resources_status_kept_from_136_dropped_before(make_emulator):
    for version, kept in (("1.35", False), ("1.36", True), ("1.37", True)):
        core = client.CoreV1Api(make_emulator(kube_version=version).api_client())
        core.create_namespaced_pod("default", health_pod())
        stored = report(core, GOOD)["status"]["containerStatuses"][0]
        assert stored.get("allocatedResourcesStatus") == (GOOD if kept else None), version


@pytest.mark.parametrize("entries, field, reason", [
    ([{"name": "claim:share", "resources": [{"resourceID": "a", "health": "Healthy"}]}],
     "status.containerStatuses[0].allocatedResourcesStatus[0].name", "FieldValueInvalid"),  # the entry has a request
    ([{"name": "nvidia.com/gpu", "resources": [{"resourceID": "a", "health": "Healthy"}]}],
     "status.containerStatuses[0].allocatedResourcesStatus[0].name", "FieldValueInvalid"),
    ([{"name": "claim:share/gpu", "resources": [{"resourceID": "a", "health": "Sick"}]}],
     "status.containerStatuses[0].allocatedResourcesStatus[0].resources[0].health", "FieldValueNotSupported"),
    ([{"name": "claim:share/gpu", "resources": [{"resourceID": "a", "health": "Healthy"},
                                                {"resourceID": "a", "health": "Unhealthy"}]}],
     "status.containerStatuses[0].allocatedResourcesStatus[0].resources[1].resourceID", "FieldValueDuplicate"),
])
def test_allocated_resources_status_is_validated(make_emulator, entries, field, reason):
    core = client.CoreV1Api(make_emulator().api_client())
    core.create_namespaced_pod("default", health_pod())
    with pytest.raises(client.ApiException) as err:
        report(core, entries)
    assert err.value.status == 422
    assert [(c["field"], c["reason"]) for c in json.loads(err.value.body)["details"]["causes"]] == [(field, reason)]
