"""The emulator enforces ValidatingAdmissionPolicies as the real server does: the shipped
deploy/base/admission.yaml on claims and DeviceClasses, and small test policies on ConfigMaps
for validationActions, failurePolicy, matchConstraints and oldObject."""

from pathlib import Path

import pytest
import yaml

from tests.support.emulator import claim_body, http

ADMISSION = Path(__file__).parents[2] / "deploy" / "base" / "admission.yaml"
SHIPPED = [d for d in yaml.safe_load_all(ADMISSION.read_text()) if d]
VAP = "/apis/admissionregistration.k8s.io/v1"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
HEAD = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GpuShareConfig"}
DENIED = "ValidatingAdmissionPolicy 'gpushare.dev-config' with binding 'gpushare.dev-config' denied request: "
COMPUTE_120 = "opaque.parameters.computeLimit: must be a percentage from 1 to 100 (got 120)"


def create(emu, doc):
    plural = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
              "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}[doc["kind"]]
    code, _, answer = http(emu, "POST", f"{VAP}/{plural}", doc)
    assert code == 201, answer


def config(**params):
    return [{"opaque": {"driver": "gpushare.dev", "parameters": {**HEAD, **params}}}]


def gpu_claim(name, **params):
    body = claim_body(name)
    body["spec"]["devices"]["config"] = config(**params)
    return body


def device_class(name, **params):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": "true"}}], "config": config(**params)}}


@pytest.fixture
def shipped(emu):
    """The emulator with deploy/base/admission.yaml's policy and binding created."""
    for doc in SHIPPED:
        create(emu, doc)
    return emu


def test_shipped_policy_refuses_a_bad_claim_with_its_message(shipped):
    code, _, answer = http(shipped, "POST", CLAIMS, gpu_claim("bad", computeLimit=120))
    cause = DENIED + "spec.devices.config[0]." + COMPUTE_120
    assert (code, answer["reason"], answer["code"]) == (422, "Invalid", 422)
    assert answer["message"] == f'resourceclaims.resource.k8s.io "bad" is forbidden: {cause}'
    assert answer["details"] == {"name": "bad", "group": "resource.k8s.io", "kind": "resourceclaims",
                                 "causes": [{"message": cause}]}
    assert http(shipped, "GET", f"{CLAIMS}/bad")[0] == 404
    code, _, answer = http(shipped, "POST", CLAIMS, gpu_claim("good", computeLimit=30, memoryLimit="4Gi"))
    assert code == 201, answer


def test_shipped_policy_refuses_an_update_patch_or_apply_that_makes_it_bad(shipped):
    code, _, stored = http(shipped, "POST", CLASSES, device_class("cls", computeLimit=50))
    assert code == 201, stored
    bad = device_class("cls", computeLimit=120)
    bad["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
    patch = {"spec": {"config": config(computeLimit=120)}}
    for method, body, content_type in (
            ("PUT", bad, "application/json"),
            ("PATCH", patch, "application/merge-patch+json"),
            ("PATCH", device_class("cls", computeLimit=120), "application/apply-patch+yaml")):
        query = "?fieldManager=test" if "apply" in content_type else ""
        code, _, answer = http(shipped, method, f"{CLASSES}/cls{query}", body, content_type)
        assert (code, answer["message"]) == (
            422, f'deviceclasses.resource.k8s.io "cls" is forbidden: {DENIED}spec.config[0].{COMPUTE_120}'), method
    assert http(shipped, "GET", f"{CLASSES}/cls")[2]["spec"]["config"] == config(computeLimit=50)
    # An apply that creates the object is a CREATE.
    code, _, answer = http(shipped, "PATCH", f"{CLASSES}/new?fieldManager=test",
                           device_class("new", computePolicy="Soft"), "application/apply-patch+yaml")
    assert code == 422 and answer["message"].endswith(
        "spec.config[0].opaque.parameters.computePolicy: must be Hard or Burst (got 'Soft')")


def test_policy_without_binding_is_not_enforced(emu):
    create(emu, next(d for d in SHIPPED if d["kind"] == "ValidatingAdmissionPolicy"))
    code, _, answer = http(emu, "POST", CLAIMS, gpu_claim("bad", computeLimit=120))
    assert code == 201, answer


# --- test policies on ConfigMaps ----------------------------------------------------------

def policy(name, expression, failure_policy="Fail", operations=("CREATE", "UPDATE"), **validation):
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {"failurePolicy": failure_policy,
                     "matchConstraints": {"resourceRules": [{
                         "apiGroups": [""], "apiVersions": ["v1"], "operations": list(operations),
                         "resources": ["configmaps"]}]},
                     "validations": [{"expression": expression, **validation}]}}


def binding(name, actions=("Deny",), **spec):
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": f"{name}-binding"},
            "spec": {"policyName": name, "validationActions": list(actions), **spec}}


def configmap(name, **data):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def bound(emu, name, expression, actions=("Deny",), **policy_options):
    create(emu, policy(name, expression, **policy_options))
    create(emu, binding(name, actions))


def test_warn_gives_a_warning_header_and_audit_nothing(emu):
    bound(emu, "warn", "object.data.size == 'small'", actions=("Warn", "Audit"), message="size must be small")
    bound(emu, "audit", "object.data.size == 'tiny'", actions=("Audit",))
    code, headers, answer = http(emu, "POST", CONFIGMAPS, configmap("big", size="big"))
    assert code == 201, answer
    assert headers.get_all("Warning") == [
        '299 - "Validation failed for ValidatingAdmissionPolicy \'warn\' with binding \'warn-binding\': '
        'size must be small"']
    code, headers, _ = http(emu, "POST", CONFIGMAPS, configmap("small", size="small"))
    assert code == 201 and headers.get_all("Warning") is None


def test_deny_without_message_names_the_expression(emu):
    bound(emu, "size", "object.data.size == 'small'")
    code, _, answer = http(emu, "POST", CONFIGMAPS, configmap("big", size="big"))
    assert (code, answer["message"]) == (
        422, 'configmaps "big" is forbidden: ValidatingAdmissionPolicy \'size\' with binding '
             '\'size-binding\' denied request: failed expression: object.data.size == \'small\'')
    assert "group" not in answer["details"]


@pytest.mark.parametrize("failure_policy", ["Fail", "Ignore"])
def test_failure_policy_on_an_expression_error(emu, failure_policy):
    bound(emu, "broken", "object.data.missing == 'x'", failure_policy=failure_policy)
    code, _, answer = http(emu, "POST", CONFIGMAPS, configmap("c", size="big"))
    if failure_policy == "Ignore":
        assert code == 201, answer
    else:
        assert code == 422
        assert answer["message"].startswith(
            'configmaps "c" is forbidden: ValidatingAdmissionPolicy \'broken\' with binding \'broken-binding\' '
            "denied request: expression 'object.data.missing == 'x'' resulted in error: "), answer["message"]


def test_match_constraints_operations_and_old_object(emu):
    # Only UPDATE is checked: a value may not change once set.
    bound(emu, "frozen", "object.data.size == oldObject.data.size", operations=("UPDATE",),
          messageExpression="'size is frozen at ' + oldObject.data.size")
    assert http(emu, "POST", CONFIGMAPS, configmap("c", size="big"))[0] == 201
    code, _, answer = http(emu, "PUT", f"{CONFIGMAPS}/c", configmap("c", size="small"))
    assert code == 422 and answer["message"].endswith("denied request: size is frozen at big")
    assert http(emu, "PUT", f"{CONFIGMAPS}/c", {**configmap("c", size="big"), "metadata": {
        "name": "c", "labels": {"a": "b"}}})[0] == 200
    # Another resource is not matched.
    code, _, answer = http(emu, "POST", "/api/v1/namespaces", {"metadata": {"name": "other"}})
    assert code == 201, answer


def test_unsupported_binding_features_fail_closed(emu):
    create(emu, policy("p", "true"))
    create(emu, binding("p", matchResources={"namespaceSelector": {"matchLabels": {"env": "test"}}}))
    code, _, answer = http(emu, "POST", CONFIGMAPS, configmap("c"))
    assert code == 422 and answer["message"].endswith(
        "denied request: failed to configure binding: the API emulator does not support matchResources")


@pytest.mark.parametrize("resources, main_refused, status_refused", [
    (["resourceclaims"], True, False), (["resourceclaims/status"], False, True),
    (["*"], True, False), (["*/*"], True, True), (["resourceclaims/*"], False, True)])
def test_resource_rules_and_subresources(emu, resources, main_refused, status_refused):
    assert http(emu, "POST", CLAIMS, claim_body("c"))[0] == 201
    deny_all = policy("none", "false")
    deny_all["spec"]["matchConstraints"]["resourceRules"] = [{
        "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["*"], "resources": resources}]
    create(emu, deny_all)
    create(emu, binding("none"))
    labelled = {**claim_body("c"), "metadata": {"name": "c", "labels": {"a": "b"}}}
    assert http(emu, "PUT", f"{CLAIMS}/c", labelled)[0] == (422 if main_refused else 200)
    status = {**claim_body("c"), "status": {"devices": []}}
    assert http(emu, "PUT", f"{CLAIMS}/c/status", status)[0] == (422 if status_refused else 200)


def refused(emu, doc):
    plural = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
              "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}[doc["kind"]]
    code, _, answer = http(emu, "POST", f"{VAP}/{plural}", doc)
    assert (code, answer["reason"]) == (422, "Invalid"), answer
    return [(c["field"], c["message"]) for c in answer["details"]["causes"]]


def test_malformed_policies_and_bindings_are_refused_on_write(emu):
    assert refused(emu, policy("p", "true", failure_policy="Sometimes")) == [
        ("spec.failurePolicy", 'Unsupported value: "Sometimes": supported values: "Fail", "Ignore"')]
    (cause,) = refused(emu, policy("p", "object.data ==", messageExpression="'fine'"))
    assert cause[0] == "spec.validations[0].expression"
    assert cause[1].startswith('Invalid value: "object.data ==": compilation failed: ')
    no_expression = policy("p", "true")
    del no_expression["spec"]["validations"][0]["expression"]
    assert refused(emu, no_expression) == [("spec.validations[0].expression", "Required value")]
    assert refused(emu, binding("p", actions=("Deny", "Block"))) == [
        ("spec.validationActions[1]", 'Unsupported value: "Block": supported values: "Audit", "Deny", "Warn"')]
    assert http(emu, "GET", f"{VAP}/validatingadmissionpolicies")[2]["items"] == []
