"""deploy/base/admission.yaml: the ValidatingAdmissionPolicy's CEL, evaluated as the API emulator
enforces it (playground/emulator/admission.py, on cel-python), refuses exactly the
GpuShareConfigs Prepare refuses, with Prepare's message (path prefix aside)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from kubeletplugin.allocation import _configs
from kubeletplugin.claimref import ClaimError
from playground.claims import DRIVER
from playground.emulator import admission

POLICY_FILE = Path(__file__).parents[2] / "deploy" / "base" / "admission.yaml"
DOCS = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
POLICY = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy")
HEAD = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GpuShareConfig"}


def admit(resource: str, obj: dict) -> str | None:
    """None when the policy admits `obj`, else its message (the emulator's evaluation)."""
    request = admission.request_attributes("resource.k8s.io", "v1", resource, "Kind", "CREATE",
                                           "default", "x")
    decisions = admission.validate(POLICY["spec"], admission.activation(POLICY["spec"], obj, None, request))
    assert len(decisions) == 1 and not decisions[0].error, decisions
    return decisions[0].message if decisions[0].denied else None


def configs(*params, driver=DRIVER) -> list[dict]:
    return [{"opaque": {"driver": driver, "parameters": p}} for p in params]


def claim(entries):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
                                 "config": entries}}}


KINDS = {  # resource -> (object with these config entries, path of the entries)
    "resourceclaims": (claim, "spec.devices.config"),
    "resourceclaimtemplates": (lambda e: {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                                          "metadata": {"name": "t", "namespace": "default"},
                                          "spec": {"spec": claim(e)["spec"]}}, "spec.spec.devices.config"),
    "deviceclasses": (lambda e: {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "d"},
                                 "spec": {"selectors": [{"cel": {"expression": "true"}}], "config": e}},
                      "spec.config"),
}


def prepare_message(entries: list[dict], path: str) -> str | None:
    """What Prepare says about the same configs, with the allocation's path swapped for `path`."""
    try:
        _configs({"devices": {"config": entries}}, DRIVER)
    except ClaimError as e:
        head = "status.allocation.devices.config"
        assert str(e).startswith(head)
        return path + str(e)[len(head):]
    return None


GOOD = [
    HEAD,
    {**HEAD, "memoryLimit": "4Gi", "computeLimit": 30},
    {**HEAD, "memoryLimit": "1.5G", "computePolicy": "Burst"},
    {**HEAD, "memoryLimit": "1.5Ki"},
    {**HEAD, "memoryLimit": 1024, "computeLimit": 100, "computePolicy": "Hard"},
    {**HEAD, "memoryLimit": "1e9", "computeLimit": 1},
    {**HEAD, "sharingStrategy": "TimeSlicing", "computePolicy": "Burst", "computeLimit": 30},
    {**HEAD, "sharingStrategy": "MPS", "computeLimit": 30, "memoryLimit": "4Gi"},
    {**HEAD, "sharingStrategy": "None", "memoryLimit": "4Gi", "computePolicy": "Hard"},
    {**HEAD, "priority": "Latency"},  # its strategy from the DeviceClass (mps.gpushare.dev); Prepare checks the merge
    {**HEAD, "sharingStrategy": "MPS", "priority": "Latency", "computeLimit": 50},
    {**HEAD, "sharingStrategy": "TimeSlicing", "priority": "Batch"},
]
BAD = [
    {**HEAD, "memoryLimit": "-4Gi"},
    {**HEAD, "memoryLimit": -5},
    {**HEAD, "memoryLimit": "4Gx"},
    {**HEAD, "memoryLimit": "0"},
    {**HEAD, "memoryLimit": 0},
    {**HEAD, "memoryLimit": "0Gi"},
    {**HEAD, "memoryLimit": "100m"},
    {**HEAD, "memoryLimit": "0.5"},
    {**HEAD, "memoryLimit": True},
    {**HEAD, "memoryLimit": None},
    {**HEAD, "memoryLimit": 1.5},
    {**HEAD, "computeLimit": 0},
    {**HEAD, "computeLimit": 101},
    {**HEAD, "computeLimit": -3},
    {**HEAD, "computeLimit": "30"},
    {**HEAD, "computeLimit": 30.5},
    {**HEAD, "computeLimit": False},
    {**HEAD, "computePolicy": "Soft"},
    {**HEAD, "computePolicy": "hard"},
    {**HEAD, "computePolicy": 1},
    {**HEAD, "sharingStrategy": "mps"},
    {**HEAD, "sharingStrategy": "none"},
    {**HEAD, "sharingStrategy": None},
    {**HEAD, "sharingStrategy": 2},
    {**HEAD, "sharingStrategy": "None", "computePolicy": "Burst"},
    {**HEAD, "sharingStrategy": "MPS", "computePolicy": "Burst"},
    {**HEAD, "sharingStrategy": "None", "computeLimit": 30},
    {**HEAD, "priority": "latency"},
    {**HEAD, "priority": "High"},
    {**HEAD, "priority": 0},
    {**HEAD, "priority": None},
    {**HEAD, "sharingStrategy": "TimeSlicing", "priority": "Latency"},
    {**HEAD, "sharingStrategy": "None", "priority": "Latency"},
    {**HEAD, "memorylimit": "4Gi"},
    {**HEAD, "extra": None},
    {**HEAD, "apiVersion": "gpushare.dev/v9"},
    {**HEAD, "apiVersion": 3},
    {"kind": "GpuShareConfig"},
    {**HEAD, "kind": "Other"},
    {"apiVersion": "gpushare.dev/v1alpha1"},
    {**HEAD, "kind": None},
    None,
    "a string",
    7,
]


@pytest.mark.parametrize("resource", KINDS)
@pytest.mark.parametrize("params", GOOD, ids=str)
def test_good_configs_admitted(resource, params):
    make, path = KINDS[resource]
    entries = configs(params)
    assert prepare_message(entries, path) is None
    assert admit(resource, make(entries)) is None


@pytest.mark.parametrize("resource", KINDS)
@pytest.mark.parametrize("params", BAD, ids=str)
def test_bad_configs_refused_with_prepares_message(resource, params):
    make, path = KINDS[resource]
    entries = configs(params)
    expected = prepare_message(entries, path)
    assert expected is not None
    assert admit(resource, make(entries)) == expected


def test_index_names_the_bad_entry_and_other_drivers_are_ignored():
    entries = [{"requests": ["gpu"]},  # no opaque: not ours
               *configs({"anything": "goes"}, driver="other.example.com"),
               *configs({**HEAD, "computeLimit": 30}),
               *configs({**HEAD, "computePolicy": "Soft"})]
    message = admit("resourceclaims", claim(entries))
    assert message == "spec.devices.config[3].opaque.parameters.computePolicy: must be Hard or Burst (got 'Soft')"
    assert message == prepare_message(entries, "spec.devices.config")
    assert admit("resourceclaims", claim(entries[:3])) is None


def test_objects_without_configs_are_admitted():
    assert admit("resourceclaims", {"spec": {"devices": {"requests": []}}}) is None
    assert admit("resourceclaimtemplates", {"spec": {"spec": {}}}) is None
    assert admit("deviceclasses", {"spec": {}}) is None
    entry = {"opaque": {"driver": DRIVER}}  # parameters missing: refused like Prepare does
    assert admit("deviceclasses", KINDS["deviceclasses"][0]([entry])) == prepare_message([entry], "spec.config")


@pytest.mark.parametrize("version", ["1.34", kubernetes_validate.utils.latest_version()])
def test_policy_and_binding_are_valid(version):
    kinds = {d["kind"] for d in DOCS}
    assert kinds == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    binding = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == POLICY["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    for d in DOCS:
        kubernetes_validate.validate(d, version, strict=True)
