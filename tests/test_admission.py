"""deploy/base/admission.yaml: the ValidatingAdmissionPolicy's CEL, evaluated with cel-python, refuses
exactly the GpuShareConfigs Prepare refuses, with Prepare's message (path prefix aside)."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import celpy
import kubernetes_validate
import pytest
import yaml
from celpy import celtypes
from kubernetes.utils import parse_quantity

from dra_driver.playground.claims import DRIVER
from kubeletplugin.allocation import _configs
from kubeletplugin.claimref import ClaimError

POLICY_FILE = Path(__file__).parents[1] / "deploy" / "base" / "admission.yaml"
DOCS = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
POLICY = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy")
HEAD = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GpuShareConfig"}

# Kubernetes' CEL quantity library (isQuantity, quantity(), sign(), isInteger()), which cel-python
# lacks: the grammar of resource.ParseQuantity, values by the kubernetes client's parser.
_QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)"
                       r"(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+))?$")


class Quantity(celtypes.StringType):
    def amount(self) -> Decimal:
        return parse_quantity(str(self))


def _quantity(text):
    if not _QUANTITY.match(str(text)):
        raise ValueError(f"not a quantity: {text!r}")
    return Quantity(text)


FUNCTIONS = {
    "isQuantity": lambda text: celtypes.BoolType(bool(_QUANTITY.match(str(text)))),
    "quantity": _quantity,
    "sign": lambda q: celtypes.IntType((q.amount() > 0) - (q.amount() < 0)),
    "isInteger": lambda q: celtypes.BoolType(q.amount() == q.amount().to_integral_value()
                                             and -2**63 <= q.amount() < 2**63),
}
_ENV = celpy.Environment()


def _program(expression: str):
    return _ENV.program(_ENV.compile(expression), functions=FUNCTIONS)


VARIABLES = [(v["name"], _program(v["expression"])) for v in POLICY["spec"]["variables"]]
(VALIDATION,) = POLICY["spec"]["validations"]
CHECK, MESSAGE = _program(VALIDATION["expression"]), _program(VALIDATION["messageExpression"])


def admit(resource: str, obj: dict) -> str | None:
    """None when the policy admits `obj`, else its message."""
    variables: dict = {}
    activation = {"object": celpy.json_to_cel(obj), "request": celpy.json_to_cel({"resource": {
        "group": "resource.k8s.io", "version": "v1", "resource": resource}})}
    for name, program in VARIABLES:  # variables see the ones before them
        variables[name] = program.evaluate({**activation, "variables": celtypes.MapType(variables)})
    activation["variables"] = celtypes.MapType(variables)
    if CHECK.evaluate(activation):
        return None
    return str(MESSAGE.evaluate(activation))


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
