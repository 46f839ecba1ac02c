import json

import pytest
from kubernetes import client

from playground.emulator import ApiEmulator
from tests.support.emulator import claim_body, http, slice_body


def create_slice(dyn, body):
    slices = dyn.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
    return slices.create(body=body)


def refused_fields(dyn, body):
    with pytest.raises(client.ApiException) as err:
        create_slice(dyn, body)
    assert err.value.status == 422
    status = json.loads(err.value.body)
    assert status["reason"] == "Invalid" and status["details"]["kind"] == "ResourceSlice"
    return [cause["field"] for cause in status["details"]["causes"]]


def test_unknown_fields_follow_field_validation(emu):
    """As the real server: Strict refuses (400), Warn (the default) and Ignore drop the field,
    Warn with a Warning header naming it."""
    slices = "/apis/resource.k8s.io/v1/resourceslices"

    def create(name, query=""):
        return http(emu, "POST", f"{slices}?{query}",
                    slice_body(name, devices=[{"name": "gpu-0", "bogus": 1}]))

    code, _, answer = create("strict", "fieldValidation=Strict")
    assert (code, answer["reason"]) == (400, "BadRequest")
    assert answer["message"] == 'strict decoding error: unknown field "spec.devices[0].bogus"'
    for name, query, warned in (("warn", "fieldValidation=Warn", True), ("default", "", True),
                                ("ignore", "fieldValidation=Ignore", False)):
        code, headers, stored = create(name, query)
        assert code == 201 and stored["spec"]["devices"] == [{"name": "gpu-0"}]
        assert headers.get_all("Warning") == (
            ['299 - "unknown field \\"spec.devices[0].bogus\\""'] if warned else None), name
    code, _, answer = create("bad", "fieldValidation=Loose")
    assert code == 400 and "fieldValidation parameter 'Loose'" in answer["message"]


def test_schema_errors_name_the_field(dyn):
    wrong_type = slice_body()
    wrong_type["spec"]["pool"]["generation"] = "one"
    assert refused_fields(dyn, wrong_type) == ["spec.pool.generation"]
    missing = slice_body()
    del missing["spec"]["driver"]
    assert refused_fields(dyn, missing) == ["spec.driver"]


def test_semantic_checks(dyn):
    assert refused_fields(dyn, slice_body(devices=[{"name": f"gpu-{i}"} for i in range(129)])) \
        == ["spec.devices"]
    create_slice(dyn, slice_body("ok-128", devices=[{"name": f"gpu-{i}"} for i in range(128)]))
    taint = {"key": "k", "effect": "NoSchedule"}
    assert refused_fields(dyn, slice_body(devices=[
        {"name": f"gpu-{i}", "taints": [taint]} for i in range(65)])) == ["spec.devices"]
    assert refused_fields(dyn, slice_body(devices=[{"name": "gpu-0"}, {"name": "gpu-0"}])) == [
        "spec.devices[1].name"]
    assert refused_fields(dyn, slice_body(devices=[{"name": "GPU_0"}])) == [
        "spec.devices[0].name"]
    assert refused_fields(dyn, slice_body(devices=[{"name": "gpu-0\n"}])) == [  # exact match, as Go's `$`
        "spec.devices[0].name"]
    no_node = slice_body()
    del no_node["spec"]["nodeName"]
    assert refused_fields(dyn, no_node) == ["spec"]
    two = slice_body()
    two["spec"]["allNodes"] = True
    assert refused_fields(dyn, two) == ["spec"]
    bad_pool = slice_body()
    bad_pool["spec"]["pool"]["name"] = "Bad Pool"
    assert refused_fields(dyn, bad_pool) == ["spec.pool.name"]


def test_invalid_claim_through_typed_client_is_refused(resource):
    body = claim_body()
    body["spec"]["devices"]["requests"].append(body["spec"]["devices"]["requests"][0])
    with pytest.raises(client.ApiException) as err:
        resource.create_namespaced_resource_claim("ns1", body)
    assert err.value.status == 422


def test_kube_version_is_configurable():
    with ApiEmulator(kube_version="1.34") as emu:
        assert emu.validator.kube_version == "1.34"
    assert ApiEmulator().validator.kube_version == "1.37"


def test_validation_can_be_disabled(dyn):
    with ApiEmulator(validate=False) as emu, emu.api_client() as api:
        from kubernetes import dynamic
        create_slice(dynamic.DynamicClient(api), slice_body(devices=[{"name": "x", "bogus": 1}]))


def consumable_slice():
    return slice_body(devices=[{
        "name": "gpu-0", "allowMultipleAllocations": True,
        "taints": [{"key": "maintenance", "effect": "NoSchedule"}],
        "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
            "default": "1Gi", "validRange": {"min": "1Gi"}}}}}])


def test_disabled_features_drop_fields_on_write():
    with ApiEmulator(consumable_capacity=False, device_taints=False) as emu, \
            emu.api_client() as api:
        resource = client.ResourceV1Api(api)
        dry = resource.create_resource_slice(consumable_slice(), dry_run="All")
        assert dry.spec.devices[0].allow_multiple_allocations is None
        resource.create_resource_slice(consumable_slice())
        device = resource.read_resource_slice("slice-a").spec.devices[0]
        assert device.allow_multiple_allocations is None and device.taints is None
        assert device.capacity["memory"].request_policy is None
        assert device.capacity["memory"].value == "80Gi"
        claim = resource.create_namespaced_resource_claim(
            "ns1", claim_body(capacity={"memory": "4Gi"}))
        assert claim.spec.devices.requests[0].exactly.capacity is None
        status = {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0",
            "shareID": "0d2f7b2c-8a34-4f65-9d3a-3f1c5b2e7a10",
            "consumedCapacity": {"memory": "4Gi"}}]}}}
        result = resource.patch_namespaced_resource_claim_status(
            "claim-a", "ns1", {"status": status}, _content_type="application/merge-patch+json")
        allocated = result.status.allocation.devices.results[0]
        assert allocated.share_id is None and allocated.consumed_capacity is None


def test_enabled_features_keep_fields(resource):
    resource.create_resource_slice(consumable_slice())
    device = resource.read_resource_slice("slice-a").spec.devices[0]
    assert device.allow_multiple_allocations is True and device.taints
    assert device.capacity["memory"].request_policy.default == "1Gi"
    claim = resource.create_namespaced_resource_claim("ns1", claim_body(capacity={"memory": "4Gi"}))
    assert claim.spec.devices.requests[0].exactly.capacity.requests == {"memory": "4Gi"}


def test_quantities_are_stored_as_the_real_server_stores_them(emu):
    """apimachinery's canonical form: a JSON number becomes a string, a value takes the largest
    suffix of its format that keeps it whole (0.5Gi -> 512Mi, 1000 -> 1k, 1.5 -> 1500m)."""
    capacity = {"memory": "0.5Gi", "compute": 20, "a": "1000", "b": "1.5", "c": "4G", "d": "1e3", "e": 0.25}
    code, _, stored = http(emu, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
                           claim_body("canonical", capacity=capacity))
    assert code == 201, stored
    assert stored["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"] == {
        "memory": "512Mi", "compute": "20", "a": "1k", "b": "1500m", "c": "4G", "d": "1e3", "e": "250m"}
    code, _, read = http(emu, "GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/canonical")
    assert read["spec"] == stored["spec"]


def test_core_events_follow_the_legacy_namespace_rule(emu):
    """pkg/apis/core/validation/events.go legacyValidateEvent: an Event about a namespaced object
    lives in its namespace; one about a cluster-scoped object in "default"."""
    def event(namespace, involved):
        return {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "e.", "namespace": namespace},
                "involvedObject": involved, "reason": "R", "message": "m", "type": "Warning"}

    claim = {"kind": "ResourceClaim", "name": "c", "namespace": "team-a"}
    node = {"kind": "Node", "name": "node-a"}
    assert http(emu, "POST", "/api/v1/namespaces/team-a/events", event("team-a", claim))[0] == 201
    assert http(emu, "POST", "/api/v1/namespaces/default/events", event("default", node))[0] == 201
    for namespace, involved in (("default", claim), ("team-a", node)):
        code, _, answer = http(emu, "POST", f"/api/v1/namespaces/{namespace}/events", event(namespace, involved))
        assert code == 422, answer
        assert "involvedObject.namespace: Invalid value: " in answer["message"]
        assert "does not match event.namespace" in answer["message"]


def test_extended_resources_in_pods_as_the_real_server_takes_them(emu):
    """pkg/apis/core/v1/defaults.go SetDefaults_Pod: requests default to limits (the scheduler
    reads requests); pkg/apis/core/validation: extended resources are whole numbers and cannot
    be overcommitted (a request needs an equal limit)."""
    def create(name, resources):
        return http(emu, "POST", "/api/v1/namespaces/default/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": resources}]}})

    code, _, stored = create("ok", {"limits": {"gpushare.dev/share": 2, "cpu": "1"}})
    assert code == 201, stored
    assert stored["spec"]["containers"][0]["resources"]["requests"] == {"gpushare.dev/share": "2", "cpu": "1"}
    for name, resources, fields, message in (
            # the limit, and the request defaulted from it, as upstream reports both
            ("half", {"limits": {"gpushare.dev/share": "500m"}},
             ["spec.containers[0].resources.limits[gpushare.dev/share]",
              "spec.containers[0].resources.requests[gpushare.dev/share]"], "must be an integer"),
            ("less", {"limits": {"gpushare.dev/share": 2}, "requests": {"gpushare.dev/share": 1}},
             ["spec.containers[0].resources.requests[gpushare.dev/share]"],
             "must be equal to gpushare.dev/share limit of 2")):
        code, _, answer = create(name, resources)
        assert code == 422, answer
        assert [c["field"] for c in answer["details"]["causes"]] == fields, answer
        assert message in answer["message"], answer


def test_extended_resource_claim_status_and_class_names_are_checked(emu):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "x"}]}}
    assert http(emu, "POST", "/api/v1/namespaces/default/pods", pod)[0] == 201
    status = {"status": {"extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-abcde",
              "requestMappings": [{"containerName": "nope", "resourceName": "gpushare.dev/share",
                                   "requestName": "container-0-request-0"}]}}}
    code, _, answer = http(emu, "PATCH", "/api/v1/namespaces/default/pods/p/status", status,
                           content_type="application/merge-patch+json")
    assert code == 422 and [c["field"] for c in answer["details"]["causes"]] == [
        "status.extendedResourceClaimStatus.requestMappings[0].containerName"], answer
    status["status"]["extendedResourceClaimStatus"]["requestMappings"][0]["containerName"] = "c"
    code, _, stored = http(emu, "PATCH", "/api/v1/namespaces/default/pods/p/status", status,
                           content_type="application/merge-patch+json")
    assert code == 200 and stored["status"]["extendedResourceClaimStatus"] == status["status"][
        "extendedResourceClaimStatus"]

    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "bad"},
                    "spec": {"extendedResourceName": "kubernetes.io/share"}}
    code, _, answer = http(emu, "POST", "/apis/resource.k8s.io/v1/deviceclasses", device_class)
    assert code == 422 and [c["field"] for c in answer["details"]["causes"]] == ["spec.extendedResourceName"], answer
