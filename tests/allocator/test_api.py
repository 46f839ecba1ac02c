"""allocate_and_reserve through the real kubernetes client against the API emulator."""

import pytest
from kubernetes import client

from playground.allocator import AllocationError, allocate_and_reserve
from tests.support.shapes import NODE, capacity_slice, claim, device_class, exactly, opaque, partition_slice, pod

try:
    from playground.emulator import ApiEmulator
except ImportError:  # built in parallel; the pure tests do not need it
    ApiEmulator = None

pytestmark = pytest.mark.skipif(ApiEmulator is None, reason="emulator not available")


@pytest.fixture
def api():
    with ApiEmulator() as emu, emu.api_client() as api_client:
        resource = client.ResourceV1Api(api_client)
        resource.create_device_class(device_class())
        resource.create_resource_slice(capacity_slice())
        resource.create_resource_slice(capacity_slice(node="node-2"))
        yield api_client, emu


def _create(api_client, a_claim):
    body = {k: v for k, v in a_claim.items() if k != "status"}
    body["metadata"] = {"name": a_claim["metadata"]["name"]}
    client.ResourceV1Api(api_client).create_namespaced_resource_claim("default", body)


def test_allocates_reserves_and_writes_status(api):
    api_client, emu = api
    _create(api_client, claim(exactly(capacity={"memory": "10Gi", "compute": "30"}), name="c1"))
    first, second = pod("pod-a"), pod("pod-b")
    written = allocate_and_reserve(api_client, "default", "c1", NODE, pod=first)
    [result] = written["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"], result["consumedCapacity"]) == \
        (NODE, "gpu-0", {"memory": "10Gi", "compute": "30"})
    assert [r["name"] for r in written["status"]["reservedFor"]] == ["pod-a"]

    # Already allocated: only the new pod is added; the allocation stays as it was.
    again = allocate_and_reserve(api_client, "default", "c1", NODE, pod=second)
    assert again["status"]["allocation"] == written["status"]["allocation"]
    assert [r["name"] for r in again["status"]["reservedFor"]] == ["pod-a", "pod-b"]
    emu.reset_requests()
    same = allocate_and_reserve(api_client, "default", "c1", NODE, pod=second)
    assert emu.count_requests(writes_only=True) == 0
    assert [r["name"] for r in same["status"]["reservedFor"]] == ["pod-a", "pod-b"]
    stored = client.ApiClient.sanitize_for_serialization(
        api_client, client.ResourceV1Api(api_client).read_namespaced_resource_claim("c1", "default"))
    assert stored["status"]["allocation"]["devices"]["results"][0]["shareID"] == result["shareID"]


def test_counts_other_allocated_claims_and_refuses_when_full(api):
    api_client, _ = api
    _create(api_client, claim(exactly(capacity={"memory": "60Gi"}), name="big"))
    _create(api_client, claim(exactly(capacity={"memory": "30Gi"}), name="too-big"))
    _create(api_client, claim(exactly(capacity={"memory": "30Gi"}), name="elsewhere"))
    allocate_and_reserve(api_client, "default", "big", NODE)
    with pytest.raises(AllocationError, match=r"request 'gpu'.*memory: needs 30Gi, 20Gi of 80Gi left"):
        allocate_and_reserve(api_client, "default", "too-big", NODE)
    assert allocate_and_reserve(api_client, "default", "elsewhere", "node-2")["status"]["allocation"]


def test_allocated_for_another_node_is_refused(api):
    api_client, _ = api
    _create(api_client, claim(exactly(), name="c1"))
    allocate_and_reserve(api_client, "default", "c1", NODE)
    with pytest.raises(AllocationError, match="allocated for node"):
        allocate_and_reserve(api_client, "default", "c1", "node-2", pod=pod())


def test_conflict_is_retried(api):
    api_client, emu = api
    _create(api_client, claim(exactly(), name="c1"))
    emu.faults.fail_next(2, status=409, method="PUT", path_contains="/status")
    written = allocate_and_reserve(api_client, "default", "c1", NODE, pod=pod())
    assert written["status"]["reservedFor"]


def test_partition_shares_with_configs_pass_server_validation(api):
    api_client, _ = api
    resource = client.ResourceV1Api(api_client)
    resource.create_device_class(device_class(name="shares", config=[opaque(memoryLimit="4Gi")]))
    resource.create_resource_slice(partition_slice(node="node-3"))
    _create(api_client, claim(exactly(device_class_name="shares", count=2), name="c1",
                              constraints=[{"matchAttribute": "gpushare.dev/uuid"}],
                              config=[{"requests": ["gpu"], **opaque(computeLimit=20)}]))
    written = allocate_and_reserve(api_client, "default", "c1", "node-3", pod=pod())
    devices = written["status"]["allocation"]["devices"]
    assert [r["device"] for r in devices["results"]] == ["gpu-0-share-0", "gpu-0-share-1"]
    assert [c["source"] for c in devices["config"]] == ["FromClass", "FromClaim"]
