import json

import pytest
from kubernetes import client

from tests.support.emulator import claim_body, pod_body, slice_body

MERGE = "application/merge-patch+json"


def error_body(exc_info):
    return json.loads(exc_info.value.body)


def test_node_pod_event_crud(core):
    node = core.create_node({"metadata": {"name": "node-a", "labels": {"zone": "a"}}})
    assert node.metadata.uid and node.metadata.generation == 1
    assert core.read_node("node-a").metadata.labels == {"zone": "a"}
    pod = core.create_namespaced_pod("default", pod_body())
    assert pod.metadata.namespace == "default" and pod.status.phase == "Pending"
    event = core.create_namespaced_event("default", {
        "metadata": {"generateName": "ev-"}, "reason": "Prepared", "message": "ok",
        "involvedObject": {"kind": "Pod", "name": "pod-a", "namespace": "default"}})
    assert event.metadata.name.startswith("ev-") and len(event.metadata.name) == 8
    assert [e.reason for e in core.list_namespaced_event(
        "default", field_selector="involvedObject.name=pod-a").items] == ["Prepared"]
    pod.metadata.labels = {"app": "x"}
    updated = core.replace_namespaced_pod("pod-a", "default", pod)
    assert updated.metadata.labels == {"app": "x"}
    assert int(updated.metadata.resource_version) > int(pod.metadata.resource_version)
    core.delete_namespaced_pod("pod-a", "default")
    core.delete_node("node-a")
    with pytest.raises(client.ApiException) as err:
        core.read_namespaced_pod("pod-a", "default")
    assert err.value.status == 404


def test_resource_crud_and_resource_versions(resource):
    created = resource.create_resource_slice(slice_body())
    assert created.metadata.generation == 1 and created.metadata.uid
    dc = resource.create_device_class({"metadata": {"name": "gpu.example.com"}, "spec": {}})
    claim = resource.create_namespaced_resource_claim("ns1", claim_body())
    template = resource.create_namespaced_resource_claim_template("ns1", {
        "metadata": {"name": "tmpl"}, "spec": {"spec": claim_body()["spec"]}})
    rvs = [int(o.metadata.resource_version) for o in (created, dc, claim, template)]
    assert rvs == sorted(rvs) and len(set(rvs)) == 4  # one global counter
    assert [c.metadata.name for c in
            resource.list_resource_claim_for_all_namespaces().items] == ["claim-a"]
    assert resource.read_namespaced_resource_claim_template("tmpl", "ns1").spec.spec
    for delete in (lambda: resource.delete_resource_slice("slice-a"),
                   lambda: resource.delete_device_class("gpu.example.com"),
                   lambda: resource.delete_namespaced_resource_claim("claim-a", "ns1"),
                   lambda: resource.delete_namespaced_resource_claim_template("tmpl", "ns1")):
        delete()
    assert resource.list_resource_slice().items == []


def test_generation_bumps_only_on_spec_change(resource):
    created = resource.create_resource_slice(slice_body())
    labelled = resource.patch_resource_slice("slice-a", {"metadata": {"labels": {"a": "b"}}},
                                             _content_type=MERGE)
    assert labelled.metadata.generation == 1
    respec = resource.patch_resource_slice(
        "slice-a", {"spec": {"devices": [{"name": "gpu-1"}]}}, _content_type=MERGE)
    assert respec.metadata.generation == 2
    noop = resource.replace_resource_slice("slice-a", respec)
    assert noop.metadata.resource_version == respec.metadata.resource_version  # no write
    assert created.metadata.uid == respec.metadata.uid


def test_not_found_already_exists_conflict_bodies(core, resource):
    with pytest.raises(client.ApiException) as err:
        resource.read_resource_slice("missing")
    assert err.value.status == 404
    assert error_body(err) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'resourceslices.resource.k8s.io "missing" not found', "reason": "NotFound",
        "details": {"name": "missing", "group": "resource.k8s.io", "kind": "resourceslices"},
        "code": 404}
    resource.create_resource_slice(slice_body())
    with pytest.raises(client.ApiException) as err:
        resource.create_resource_slice(slice_body())
    assert err.value.status == 409 and error_body(err)["reason"] == "AlreadyExists"
    first = resource.read_resource_slice("slice-a")
    resource.patch_resource_slice("slice-a", {"metadata": {"labels": {"x": "1"}}},
                                  _content_type=MERGE)
    with pytest.raises(client.ApiException) as err:
        resource.replace_resource_slice("slice-a", first)  # stale resourceVersion
    body = error_body(err)
    assert err.value.status == 409 and body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]
    with pytest.raises(client.ApiException) as err:
        core.read_namespaced_pod("nope", "default")
    assert error_body(err)["details"] == {"name": "nope", "kind": "pods"}


def test_merge_strategic_and_json_patch(core):
    core.create_namespaced_pod("default", pod_body(labels={"a": "1", "b": "2"}))
    merged = core.patch_namespaced_pod("pod-a", "default",
                                       {"metadata": {"labels": {"a": None, "c": "3"}}},
                                       _content_type=MERGE)
    assert merged.metadata.labels == {"b": "2", "c": "3"}
    strategic = core.patch_namespaced_pod("pod-a", "default",
                                          {"metadata": {"annotations": {"k": "v"}}})
    assert strategic.metadata.annotations == {"k": "v"}
    # A list body goes out as application/json-patch+json.
    patched = core.patch_namespaced_pod("pod-a", "default", [
        {"op": "test", "path": "/metadata/labels/b", "value": "2"},
        {"op": "replace", "path": "/metadata/labels/b", "value": "20"},
        {"op": "remove", "path": "/metadata/labels/c"}])
    assert patched.metadata.labels == {"b": "20"}
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_pod("pod-a", "default", [
            {"op": "test", "path": "/metadata/labels/b", "value": "nope"}])
    assert err.value.status == 422
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_pod("pod-a", "default", {"metadata": {"resourceVersion": "1"}},
                                  _content_type=MERGE)
    assert err.value.status == 409


def test_claim_status_subresource(resource):
    claim = resource.create_namespaced_resource_claim("ns1", {
        **claim_body(), "status": {"reservedFor": [{"resource": "pods", "name": "x",
                                                    "uid": "u"}]}})
    assert claim.status is None or not claim.status.reserved_for  # status dropped on create
    allocation = {"devices": {"results": [{"request": "gpu", "driver": "gpu.example.com",
                                           "pool": "node-a", "device": "gpu-0"}]}}
    with_status = resource.patch_namespaced_resource_claim_status(
        "claim-a", "ns1", {"status": {"allocation": allocation}, "metadata": {
            "labels": {"ignored": "yes"}}, "spec": {"devices": {"requests": []}}},
        _content_type=MERGE)
    assert with_status.status.allocation.devices.results[0].device == "gpu-0"
    assert with_status.metadata.labels is None  # metadata changes ignored on /status
    assert with_status.spec.devices.requests[0].name == "gpu"  # spec changes ignored
    with_status.status.allocation = None
    with_status.metadata.labels = {"kept": "yes"}
    main = resource.replace_namespaced_resource_claim("claim-a", "ns1", with_status)
    assert main.metadata.labels == {"kept": "yes"}
    assert main.status.allocation.devices.results[0].device == "gpu-0"  # status kept
    read = resource.read_namespaced_resource_claim_status("claim-a", "ns1")
    assert read.status.allocation is not None


def test_finalizers_delay_deletion(resource):
    body = claim_body()
    body["metadata"]["finalizers"] = ["example.com/protect"]
    resource.create_namespaced_resource_claim("ns1", body)
    deleting = resource.delete_namespaced_resource_claim("claim-a", "ns1")
    assert deleting.metadata.deletion_timestamp is not None
    assert resource.read_namespaced_resource_claim("claim-a", "ns1").metadata.deletion_timestamp
    resource.patch_namespaced_resource_claim("claim-a", "ns1", {"metadata": {
        "finalizers": None}}, _content_type=MERGE)
    with pytest.raises(client.ApiException) as err:
        resource.read_namespaced_resource_claim("claim-a", "ns1")
    assert err.value.status == 404


def test_list_selectors(core, resource):
    for i in range(4):
        core.create_namespaced_pod("default", pod_body(
            f"pod-{i}", node=f"node-{i % 2}", labels={"app": "a" if i < 2 else "b",
                                                      "tier": str(i)}))
    resource.create_resource_slice(slice_body("s0", "node-0"))
    resource.create_resource_slice(slice_body("s1", "node-1", driver="other.example.com"))

    def pods(**kw):
        return sorted(p.metadata.name for p in core.list_namespaced_pod("default", **kw).items)

    assert pods(label_selector="app=a") == ["pod-0", "pod-1"]
    assert pods(label_selector="app==b,tier!=3") == ["pod-2"]
    assert pods(label_selector="tier in (0, 3)") == ["pod-0", "pod-3"]
    assert pods(label_selector="tier notin (0,3),app") == ["pod-1", "pod-2"]
    assert pods(label_selector="!app") == []
    assert pods(field_selector="spec.nodeName=node-1") == ["pod-1", "pod-3"]
    assert pods(field_selector="metadata.name!=pod-0,spec.nodeName==node-0") == ["pod-2"]
    assert [s.metadata.name for s in resource.list_resource_slice(
        field_selector="spec.driver=other.example.com").items] == ["s1"]
    assert [s.metadata.name for s in resource.list_resource_slice(
        field_selector="spec.nodeName=node-0").items] == ["s0"]
    with pytest.raises(client.ApiException) as err:
        resource.list_resource_slice(field_selector="spec.bogus=x")
    assert err.value.status == 400
    assert error_body(err)["message"] == "field label not supported: spec.bogus"


def test_list_pagination(core):
    for i in range(5):
        core.create_namespaced_pod("default", pod_body(f"pod-{i}"))
    page = core.list_namespaced_pod("default", limit=2)
    names = [p.metadata.name for p in page.items]
    while page.metadata._continue:
        page = core.list_namespaced_pod("default", limit=2, _continue=page.metadata._continue)
        names += [p.metadata.name for p in page.items]
    assert names == [f"pod-{i}" for i in range(5)]


def test_dry_run_create_and_update_not_stored(resource):
    dry = resource.create_resource_slice(slice_body(), dry_run="All")
    assert dry.metadata.uid and dry.metadata.name == "slice-a"
    assert resource.list_resource_slice().items == []
    resource.create_resource_slice(slice_body())
    stored = resource.read_resource_slice("slice-a")
    stored.metadata.labels = {"dry": "run"}
    assert resource.replace_resource_slice("slice-a", stored, dry_run="All").metadata.labels \
        == {"dry": "run"}
    assert resource.read_resource_slice("slice-a").metadata.labels == {"node": "node-a"}


def test_namespace_mismatch_and_missing_name(core):
    body = pod_body()
    body["metadata"]["namespace"] = "other"
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_pod("default", body)
    assert err.value.status == 400
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_pod("default", {"metadata": {}, "spec": pod_body()["spec"]})
    assert err.value.status == 422
    assert error_body(err)["details"]["causes"][0]["field"] == "metadata.name"


def test_discovery_and_dynamic_client(dyn, emu):
    slices = dyn.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
    assert not slices.namespaced
    slices.create(body=slice_body())
    assert [s.metadata.name for s in slices.get().items] == ["slice-a"]
    claims = dyn.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
    assert claims.namespaced
    assert dyn.resources.get(api_version="v1", kind="Pod").namespaced
    assert dyn.version["kubernetes"]["major"] == "1"


def test_kubeconfig(emu, tmp_path):
    from kubernetes import config
    path = emu.write_kubeconfig(str(tmp_path / "kubeconfig"))
    api_client = config.new_client_from_config(config_file=path)
    assert client.CoreV1Api(api_client).list_node().items == []


def test_strategic_merge_patch_merges_keyed_lists(resource):
    body = claim_body()
    body["metadata"]["finalizers"] = ["a/x"]
    resource.create_namespaced_resource_claim("ns1", body)
    first = {"resource": "pods", "name": "p1", "uid": "u1"}
    second = {"resource": "pods", "name": "p2", "uid": "u2"}
    for consumer in (first, second):  # dict bodies go out as strategic merge patches
        claim = resource.patch_namespaced_resource_claim_status(
            "claim-a", "ns1", {"status": {"reservedFor": [consumer]}})
    assert [r.uid for r in claim.status.reserved_for] == ["u1", "u2"]
    claim = resource.patch_namespaced_resource_claim_status(
        "claim-a", "ns1", {"status": {"reservedFor": [{"uid": "u1", "$patch": "delete"}]}})
    assert [r.uid for r in claim.status.reserved_for] == ["u2"]
    claim = resource.patch_namespaced_resource_claim(
        "claim-a", "ns1", {"metadata": {"finalizers": ["b/y"]}})
    assert claim.metadata.finalizers == ["a/x", "b/y"]
    # A merge patch replaces lists.
    claim = resource.patch_namespaced_resource_claim(
        "claim-a", "ns1", {"metadata": {"finalizers": ["c/z"]}}, _content_type=MERGE)
    assert claim.metadata.finalizers == ["c/z"]


def test_strategic_merge_patch_directives():
    """What kubectl's client-side apply sends: $setElementOrder, $patch, $deleteFromPrimitiveList."""
    from playground.emulator.patch import strategic_merge_patch

    live = {"spec": {"containers": [{"name": "a", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
                                    {"name": "b"}],
                     "nodeSelector": {"k": "v"}, "args": ["--one", "--two"]},
            "metadata": {"finalizers": ["f1", "f2"]}}
    patch = {"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                      "containers": [{"name": "a", "$setElementOrder/env": [{"name": "Y"}],
                                      "env": [{"name": "X", "$patch": "delete"}]}],
                      "nodeSelector": {"$patch": "replace", "other": "w"}},
             "metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"]}}
    assert strategic_merge_patch(live, patch) == {
        "spec": {"containers": [{"name": "b"}, {"name": "a", "env": [{"name": "Y", "value": "2"}]}],
                 "nodeSelector": {"other": "w"}, "args": ["--one", "--two"]},
        "metadata": {"finalizers": ["f2"]}}
    assert strategic_merge_patch(live, {"spec": {"nodeSelector": {"$patch": "delete"}}})["spec"].get(
        "nodeSelector") is None
