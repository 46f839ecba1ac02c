"""What an operator's tools need from the emulator, checked without kubectl: health, OpenAPI,
Table output, server-side apply, immutable claim specs, garbage collection, validation."""

import json

import pytest
import yaml
from kubernetes import client

from tests.support.emulator import claim_body, http, pod_body, slice_body

TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
APPLY = "application/apply-patch+yaml"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims"


def test_health_endpoints(emu):
    for path in ("/healthz", "/readyz", "/livez", "/readyz?verbose"):
        code, headers, text = http(emu, "GET", path)
        assert (code, text) == (200, "ok") and headers["Content-Type"].startswith("text/plain")


def test_openapi_v2_and_v3_describe_the_served_kinds(emu):
    code, _, v2 = http(emu, "GET", "/openapi/v2", headers={"Accept": "application/json"})
    assert code == 200 and v2["swagger"] == "2.0"
    claim = v2["definitions"]["io.k8s.api.resource.v1.ResourceClaim"]
    assert claim["x-kubernetes-group-version-kind"] == [
        {"group": "resource.k8s.io", "kind": "ResourceClaim", "version": "v1"}]
    assert claim["properties"]["spec"]["allOf"] == [
        {"$ref": "#/definitions/io.k8s.api.resource.v1.ResourceClaimSpec"}]
    patch = v2["paths"]["/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"]["patch"]
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
    assert "io.k8s.api.apps.v1.DaemonSet" in v2["definitions"]
    protobuf_only = {"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"}
    assert http(emu, "GET", "/openapi/v2", headers=protobuf_only)[0] == 406

    code, _, root = http(emu, "GET", "/openapi/v3")
    url = root["paths"]["apis/resource.k8s.io/v1"]["serverRelativeURL"]
    assert code == 200 and url.startswith("/openapi/v3/apis/resource.k8s.io/v1?hash=")
    code, _, v3 = http(emu, "GET", url)
    schemas = v3["components"]["schemas"]
    assert code == 200 and v3["openapi"].startswith("3.")
    # As published: single types, quantities as strings, refs into components.
    memory = schemas["io.k8s.api.resource.v1.CapacityRequirements"]["properties"]["requests"]
    assert memory["type"] == "object" and memory["additionalProperties"] == {
        "$ref": "#/components/schemas/io.k8s.apimachinery.pkg.api.resource.Quantity"}
    assert schemas["io.k8s.apimachinery.pkg.api.resource.Quantity"]["type"] == "string"
    assert "io.k8s.api.core.v1.Pod" not in schemas  # one group/version per document
    assert http(emu, "GET", "/openapi/v3/apis/nothing.example.com/v1")[0] == 404


def table_of(emu, path):
    code, _, answer = http(emu, "GET", path, headers=TABLE)
    assert code == 200 and answer["kind"] == "Table", answer
    return [c["name"] for c in answer["columnDefinitions"]], [r["cells"] for r in answer["rows"]], answer


def test_tables_have_the_real_servers_columns(emu, resource, core):
    resource.create_resource_slice(slice_body())
    resource.create_namespaced_resource_claim("ns1", claim_body("pending"))
    resource.create_namespaced_resource_claim("ns1", claim_body("allocated"))
    status = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}]}}}}
    resource.patch_namespaced_resource_claim_status("allocated", "ns1", status)
    columns, rows, answer = table_of(emu, CLAIMS)
    assert columns == ["Name", "State", "Age"]
    assert [r[:2] for r in rows] == [["allocated", "allocated"], ["pending", "pending"]]
    assert answer["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    columns, rows, _ = table_of(emu, "/apis/resource.k8s.io/v1/resourceslices/slice-a")
    assert columns == ["Name", "Node", "Driver", "Pool", "Age"]
    assert rows[0][:4] == ["slice-a", "node-a", "gpu.example.com", "node-a"]
    core.create_namespaced_pod("ns1", pod_body())
    columns, rows, _ = table_of(emu, "/api/v1/namespaces/ns1/pods")
    assert columns == ["Name", "Ready", "Status", "Restarts", "Age"] and rows[0][:4] == ["pod-a", "0/1", "Pending", 0]
    http(emu, "POST", "/api/v1/nodes", {
        "metadata": {"name": "node-a", "labels": {"node-role.kubernetes.io/worker": ""}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.34.0"}}})
    columns, rows, _ = table_of(emu, "/api/v1/nodes")
    assert columns == ["Name", "Status", "Roles", "Age", "Version"]
    assert rows[0][:3] == ["node-a", "Ready", "worker"] and rows[0][4] == "v1.34.0"
    http(emu, "POST", "/api/v1/namespaces/ns1/configmaps", {"metadata": {"name": "cm"}})
    columns, rows, _ = table_of(emu, "/api/v1/namespaces/ns1/configmaps")  # no printer: the default
    assert columns == ["Name", "Created At"] and rows[0][0] == "cm"
    # Without the Table Accept header: the plain list.
    assert http(emu, "GET", CLAIMS)[2]["kind"] == "ResourceClaimList"


def apply(emu, path, obj, manager="ops"):
    return http(emu, "PATCH", f"{path}?fieldManager={manager}" if manager else path,
                yaml.safe_dump(obj).encode(), APPLY)


def test_server_side_apply(emu, resource):
    body = claim_body("applied")
    body["metadata"]["labels"] = {"team": "a", "tier": "gold"}
    code, _, created = apply(emu, f"{CLAIMS}/applied", body)
    assert code == 201 and created["metadata"]["managedFields"][0]["manager"] == "ops"
    assert apply(emu, f"{CLAIMS}/applied", body, manager=None)[0] == 400  # fieldManager is required
    other = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "applied", "labels": {"owner": "b"}}}
    assert apply(emu, f"{CLAIMS}/applied", other, manager="b")[0] == 200
    del body["metadata"]["labels"]["tier"]
    code, _, updated = apply(emu, f"{CLAIMS}/applied", body)
    # What ops stopped applying goes; what manager b applied stays.
    assert code == 200 and updated["metadata"]["labels"] == {"team": "a", "owner": "b"}
    assert sorted(m["manager"] for m in updated["metadata"]["managedFields"]) == ["b", "ops"]
    assert resource.read_namespaced_resource_claim("applied", "ns1").spec.devices.requests[0].name == "gpu"
    code, _, again = apply(emu, f"{CLAIMS}/applied", body)
    assert code == 200 and again["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]


def test_claim_spec_is_immutable(emu, resource):
    resource.create_namespaced_resource_claim("ns1", claim_body())
    with pytest.raises(client.ApiException) as err:
        resource.patch_namespaced_resource_claim("claim-a", "ns1", {"spec": {"devices": {"requests": [
            {"name": "other", "exactly": {"deviceClassName": "gpu.example.com"}}]}}})
    status = json.loads(err.value.body)
    assert err.value.status == 422 and status["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": "Invalid value: field is immutable", "field": "spec"}]
    # Metadata and status still change.
    resource.patch_namespaced_resource_claim("claim-a", "ns1", {"metadata": {"labels": {"a": "b"}}})
    resource.patch_namespaced_resource_claim_status("claim-a", "ns1", {"status": {"reservedFor": [
        {"resource": "pods", "name": "p", "uid": "5b0b3e9c-1f1e-4b7c-8a52-3a2d0d1f3e44"}]}})


def owned_slice(name, *owners):
    body = slice_body(name)
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": n.metadata.name, "uid": n.metadata.uid} for n in owners]
    return body


def test_garbage_collection_follows_owner_references(core, resource):
    a, b = (core.create_node({"metadata": {"name": n}}) for n in ("node-a", "node-b"))
    resource.create_resource_slice(owned_slice("only-a", a))
    resource.create_resource_slice(owned_slice("a-and-b", a, b))
    resource.create_resource_slice(owned_slice("only-b", b))
    core.delete_node("node-a")
    names = {s.metadata.name: s for s in resource.list_resource_slice().items}
    assert set(names) == {"a-and-b", "only-b"}  # a dependent with an owner left stays...
    assert [r.name for r in names["a-and-b"].metadata.owner_references] == ["node-b"]  # ...without the dangling one
    core.delete_node("node-b", propagation_policy="Orphan")
    kept = resource.read_resource_slice("only-b")
    assert not kept.metadata.owner_references


def test_garbage_collection_waits_for_the_owners_finalizers(core, resource):
    node = core.create_node({"metadata": {"name": "node-a", "finalizers": ["example.com/hold"]}})
    resource.create_resource_slice(owned_slice("s", node))
    core.delete_node("node-a")
    assert resource.read_resource_slice("s")  # the node is only marked for deletion
    core.patch_node("node-a", {"metadata": {"finalizers": None}})
    assert resource.list_resource_slice().items == []


def test_decoding_checks(emu, resource, core):
    claim = claim_body("lots", capacity={"memory": "lots"})
    code, _, answer = http(emu, "POST", CLAIMS, claim)
    assert code == 400 and "quantities must match the regular expression" in answer["message"]
    assert "spec.devices.requests[0].exactly.capacity.requests.memory" in answer["message"]
    zero = claim_body("zero")
    zero["spec"]["devices"]["requests"][0]["exactly"]["count"] = 0
    code, _, answer = http(emu, "POST", CLAIMS, zero)
    assert code == 422 and answer["details"]["causes"][0]["field"] == "spec.devices.requests[0].exactly.count"
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "c"},
                    "spec": {"selectors": [{"cel": {"expression": "device.driver == "}}]}}
    code, _, answer = http(emu, "POST", "/apis/resource.k8s.io/v1/deviceclasses", device_class)
    assert code == 422 and answer["details"]["causes"][0]["field"] == "spec.selectors[0].cel.expression"
    pod = pod_body()
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    code, _, answer = http(emu, "POST", "/api/v1/namespaces/ns1/pods", pod)
    assert code == 422 and answer["details"]["causes"][0]["field"] == "spec.containers[0].resources.claims[0].name"
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "claim-a"}]
    assert http(emu, "POST", "/api/v1/namespaces/ns1/pods", pod)[0] == 201
