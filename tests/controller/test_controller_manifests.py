"""deploy/ manifests of the controller: valid for the oldest and newest supported Kubernetes."""

import pathlib

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = [ROOT / "deploy/base/deviceclass.yaml", ROOT / "deploy/base/rbac.yaml",
         *sorted((ROOT / "deploy/examples").glob("*/*.yaml"))]
VERSIONS = ["1.34", kubernetes_validate.utils.latest_version()]


def documents(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_manifest_valid(path, version):
    docs = documents(path)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_examples_cover_the_documented_cases():
    examples = {f"{p.parent.name}/{p.name}": documents(p) for p in FILES if p.parent.parent.name == "examples"}
    kinds = {n: [d["kind"] for d in docs] for n, docs in examples.items()}
    assert kinds["capacity/claim-template.yaml"][0] == "ResourceClaimTemplate"
    assert kinds["capacity/shared-claim.yaml"] == ["ResourceClaim", "Pod", "Pod"]
    template = examples["capacity/claim-template.yaml"][0]
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"] == \
        {"memory": "10Gi", "compute": "30"}
    two, _pod = examples["partition/two-shares.yaml"]
    assert two["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    assert two["spec"]["devices"]["constraints"][0]["matchAttribute"] == "gpushare.dev/uuid"


def test_deviceclass_selects_the_driver():
    [dc] = documents(ROOT / "deploy/base/deviceclass.yaml")
    assert dc["metadata"]["name"] == "gpushare.dev"
    assert dc["spec"]["selectors"][0] == {"cel": {"expression": 'device.driver == "gpushare.dev"'}}
    assert 'sharingStrategy != "MPS"' in dc["spec"]["selectors"][1]["cel"]["expression"]  # MPS-only GPUs are not its


def test_rbac_is_least_privilege():
    [role] = [d for d in documents(ROOT / "deploy/base/rbac.yaml") if d["kind"] == "ClusterRole"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert ("resource.k8s.io", "resourceslices", "watch") in granted
    assert ("", "nodes", "get") in granted and ("", "nodes", "list") not in granted
    assert ("", "events", "create") in granted
    assert not any("*" in item for item in granted)
    assert not any(v in ("create", "delete", "update") for g, r, v in granted if r == "resourceclaims")


def test_examples_accepted_by_a_server_with_consumable_capacity(emulator):
    """The API emulator (upstream schema + the gates) takes the claims as written, capacity asks kept."""
    api = client.ApiClient(emulator.client_configuration())
    resource = client.ResourceV1Api(api)
    for path in FILES:
        for doc in documents(path):
            if doc["kind"] == "ResourceClaim":
                created = resource.create_namespaced_resource_claim("default", doc)
                request = created.spec.devices.requests[0].exactly
                if path.name == "shared-claim.yaml":
                    assert request.capacity.requests == {"memory": "8Gi", "compute": "25"}
            elif doc["kind"] == "ResourceClaimTemplate":
                resource.create_namespaced_resource_claim_template("default", doc)
            elif doc["kind"] == "DeviceClass":
                resource.create_device_class(doc)
