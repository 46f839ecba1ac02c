"""deploy/base/admission-requests.yaml: capacity requests no GPU can hold are refused at apply
time, surprising ones (memory off the 256Mi step, fractional compute, a gpushare-looking class
that is not one) are admitted with a warning. Evaluated as the API emulator enforces it, and
end to end with the real kubectl, which prints the warnings as "Warning: ..." lines."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from playground.claims import DRIVER
from playground.emulator import admission
from tests.support.kubectl import Kubectl, needs_kubectl

POLICY_FILE = Path(__file__).parents[2] / "deploy" / "base" / "admission-requests.yaml"
DOCS = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
POLICIES = {d["metadata"]["name"]: d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy"}
DENY, WARN = POLICIES["gpushare.dev-requests"], POLICIES["gpushare.dev-requests-warnings"]


def verdict(policy: dict, resource: str, obj: dict) -> str | None:
    """None when the policy's one validation passes, else its message."""
    request = admission.request_attributes("resource.k8s.io", "v1", resource, "Kind", "CREATE", "default", "x")
    [decision] = admission.validate(policy["spec"], admission.activation(policy["spec"], obj, None, request))
    assert not decision.error, decision
    return decision.message if decision.denied else None


def ask(device_class: str = DRIVER, **capacity: str) -> dict:
    return {"deviceClassName": device_class, **({"capacity": {"requests": capacity}} if capacity else {})}


def claim(*requests: dict) -> dict:
    """A claim with one request per ask: a dict is `exactly`, a list of dicts `firstAvailable`."""
    entries = [{"name": f"r{i}", **({"exactly": a} if isinstance(a, dict) else
                                    {"firstAvailable": [{"name": f"s{j}", **s} for j, s in enumerate(a)]})}
               for i, a in enumerate(requests)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": {"requests": entries}}}


def template(*requests: dict) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": "default"}, "spec": {"spec": claim(*requests)["spec"]}}


FITS = [ask(), ask(memory="6Gi", compute="20"), ask(memory="288Gi", compute="100"), ask(memory="512Mi", compute="5"),
        ask(**{"gpushare.dev/memory": "1Gi", "gpushare.dev/compute": "1"}), ask(memory="1073741824", compute="10"),
        ask("other.example.com", memory="4G", compute="150"),  # not ours: not looked at
        ask("gpu.nvidia.com")]


@pytest.mark.parametrize("fits", FITS, ids=str)
def test_requests_that_fit_pass_both_policies(fits):
    for resource, make in (("resourceclaims", claim), ("resourceclaimtemplates", template)):
        assert verdict(DENY, resource, make(fits)) is None
        assert verdict(WARN, resource, make(fits)) is None


def test_compute_over_a_whole_gpu_is_refused():
    assert verdict(DENY, "resourceclaims", claim(ask(memory="6Gi", compute="150"))) == (
        "spec.devices.requests[0].exactly.capacity.requests.compute: a GPU has 100 (percent of its time); "
        "no request can exceed it (got '150')")


def test_memory_over_the_largest_gpu_is_refused():
    assert verdict(DENY, "resourceclaims", claim(ask(**{"gpushare.dev/memory": "300Gi"}))) == (
        "spec.devices.requests[0].exactly.capacity.requests.gpushare.dev/memory: more than the largest GPU "
        "has (288Gi, the largest GPU made; no node has published its GPUs yet); no GPU can hold it (got '300Gi')")


def test_template_and_subrequest_paths_name_the_bad_ask():
    obj = template(ask(), [ask("gpu.nvidia.com"), ask(memory="4Gi"), ask(compute="101")])
    assert verdict(DENY, "resourceclaimtemplates", obj) == (
        "spec.spec.devices.requests[1].firstAvailable[2].capacity.requests.compute: a GPU has 100 "
        "(percent of its time); no request can exceed it (got '101')")


def test_decimal_memory_is_admitted_with_the_rounding_it_gets():
    obj = claim(ask(memory="6Gi", compute="20"), ask(memory="4G"))
    assert verdict(DENY, "resourceclaims", obj) is None
    assert verdict(WARN, "resourceclaims", obj) == (
        "spec.devices.requests[1].exactly.capacity.requests.memory: 4000000000 bytes is not a multiple of "
        "256Mi; the scheduler rounds it up to 3840Mi (k, M, G, T are powers of 10; Ki, Mi, Gi, Ti powers "
        "of 2) (got '4G')")
    assert verdict(WARN, "resourceclaims", claim(ask(memory="1000Mi"))) == (
        "spec.devices.requests[0].exactly.capacity.requests.memory: 1048576000 bytes is not a multiple of "
        "256Mi; the scheduler rounds it up to 1024Mi (got '1000Mi')")


def test_fractional_compute_is_warned():
    assert verdict(WARN, "resourceclaims", claim(ask(compute="12.5"))) == (
        "spec.devices.requests[0].exactly.capacity.requests.compute: compute is a whole percent of the GPU; "
        "the scheduler rounds it up (got '12.5')")


@pytest.mark.parametrize("name", ["gpushare.dve", "gpushare", "gpushare.dev-a100"])
def test_a_gpushare_looking_class_that_is_not_one_is_warned(name):
    assert verdict(WARN, "resourceclaims", claim(ask(name, compute="150"))) == (
        f"spec.devices.requests[0].exactly.deviceClassName: not one of gpushare's DeviceClasses (gpushare.dev, "
        f"mps.gpushare.dev); "
        f"the claim waits at scheduling unless a DeviceClass of that name exists (got '{name}')")
    assert verdict(DENY, "resourceclaims", claim(ask(name, compute="150"))) is None  # not known to be ours


def test_the_mps_class_is_gpushares_and_checked_alike():
    """mps.gpushare.dev (issue 27) is one of gpushare's classes: not warned about by name, and its
    requests are checked as gpushare.dev's are."""
    assert verdict(WARN, "resourceclaims", claim(ask("mps.gpushare.dev", memory="1Gi", compute="25"))) is None
    assert "no request can exceed it (got '150')" in (verdict(DENY, "resourceclaims",
                                                               claim(ask("mps.gpushare.dev", compute="150"))) or "")


def test_objects_without_requests_pass():
    for policy in (DENY, WARN):
        assert verdict(policy, "resourceclaims", {"spec": {"devices": {}}}) is None
        assert verdict(policy, "resourceclaimtemplates", {"spec": {"spec": {}}}) is None


def test_the_policies_walk_requests_with_the_same_variables():
    """Written out in each policy (a policy cannot share variables): they must not drift apart."""
    shared = ("classes", "prefix", "requests", "asks", "memoryKeys", "computeKeys")
    deny = {v["name"]: v["expression"] for v in DENY["spec"]["variables"]}
    warn = {v["name"]: v["expression"] for v in WARN["spec"]["variables"]}
    assert [deny[n] for n in shared] == [warn[n] for n in shared]
    assert DENY["spec"]["matchConstraints"] == WARN["spec"]["matchConstraints"]


@pytest.mark.parametrize("version", ["1.34", kubernetes_validate.utils.latest_version()])
def test_policies_and_bindings_are_valid(version):
    bindings = {d["spec"]["policyName"]: d["spec"]["validationActions"] for d in DOCS
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert bindings == {"gpushare.dev-requests": ["Deny"], "gpushare.dev-requests-warnings": ["Warn"]}
    for d in DOCS:
        kubernetes_validate.validate(d, version, strict=True)


@pytest.fixture
def kubectl(emulator, tmp_path):
    """The real kubectl against an emulator holding the shipped DeviceClass and these policies."""
    k = Kubectl(tmp_path, kubeconfig=emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    deploy = POLICY_FILE.parent
    k("apply", "-f", POLICY_FILE, "-f", deploy / "deviceclass.yaml")
    return k


def manifest(name: str, **capacity: str) -> str:
    body = claim(ask(**capacity))
    body["metadata"] = {"name": name}
    return yaml.safe_dump(body)


@needs_kubectl
def test_kubectl_apply_refuses_and_warns(kubectl):
    refused = kubectl.run("apply", "-f", "-", input=manifest("too-much", memory="6Gi", compute="150"), check=False)
    assert refused.returncode != 0
    assert ("ValidatingAdmissionPolicy 'gpushare.dev-requests' with binding 'gpushare.dev-requests' denied "
            "request: spec.devices.requests[0].exactly.capacity.requests.compute: a GPU has 100") in refused.stderr
    big = kubectl.run("apply", "-f", "-", input=manifest("too-big", memory="1Ti"), check=False)
    assert big.returncode != 0 and "more than the largest GPU has (288Gi" in big.stderr
    warned = kubectl.run("apply", "-f", "-", input=manifest("decimal", memory="4G"))
    assert warned.stdout.strip() == "resourceclaim.resource.k8s.io/decimal created"
    assert ("Warning: Validation failed for ValidatingAdmissionPolicy 'gpushare.dev-requests-warnings' with "
            "binding 'gpushare.dev-requests-warnings': spec.devices.requests[0].exactly.capacity.requests.memory: "
            "4000000000 bytes is not a multiple of 256Mi; the scheduler rounds it up to 3840Mi") in warned.stderr
    typo = claim(ask("gpushare.dve"))
    typo["metadata"] = {"name": "typo"}
    warned = kubectl.run("apply", "-f", "-", input=yaml.safe_dump(typo))
    assert "Warning: " in warned.stderr and "deviceClassName: not one of gpushare's DeviceClasses" in warned.stderr
    assert kubectl("get", "resourceclaims", "-o", "name").split() == [
        "resourceclaim.resource.k8s.io/decimal", "resourceclaim.resource.k8s.io/typo"]


@needs_kubectl
def test_without_consumable_capacity_the_policies_never_see_the_ask(make_emulator, tmp_path):
    """The API server drops the gated `capacity` before validating admission runs (the registry's
    BeforeCreate, then createValidation): the claim is stored without it and nothing is said at
    apply time; the kubelet plugin's CapacityRequestDropped Event tells instead
    (tests/kubeletplugin/test_capacity_event.py)."""
    emu = make_emulator(consumable_capacity=False)
    k = Kubectl(tmp_path, kubeconfig=emu.write_kubeconfig(tmp_path / "kubeconfig"))
    k("apply", "-f", POLICY_FILE, "-f", POLICY_FILE.parent / "deviceclass.yaml")
    out = k.run("apply", "-f", "-", input=manifest("gated", memory="4G", compute="150"))
    assert (out.stdout.strip(), out.stderr) == ("resourceclaim.resource.k8s.io/gated created", "")
    stored = k.objects("get", "resourceclaim", "gated", "-o", "yaml")[0]
    assert "capacity" not in stored["spec"]["devices"]["requests"][0]["exactly"]
