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
POD_WARN = POLICIES["gpushare.dev-pod-warnings"]


def verdicts(policy: dict, resource: str, obj: dict) -> list[str]:
    """The message of each of the policy's validations that fails (kubectl prints one line each)."""
    request = admission.request_attributes("resource.k8s.io", "v1", resource, "Kind", "CREATE", "default", "x")
    decisions = admission.validate(policy["spec"], admission.activation(policy["spec"], obj, None, request))
    assert not [d for d in decisions if d.error], decisions
    return [d.message for d in decisions if d.denied]


def verdict(policy: dict, resource: str, obj: dict) -> str | None:
    """None when every validation of the policy passes, else the first failing one's message."""
    failed = verdicts(policy, resource, obj)
    return failed[0] if failed else None


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


def configured(obj: dict, parameters: dict, requests: list[str] | None = None) -> dict:
    """obj (a claim or template) with one gpushare config entry."""
    entry = {"opaque": {"driver": DRIVER, "parameters": {"apiVersion": "gpushare.dev/v1alpha1",
                                                         "kind": "GpuShareConfig", **parameters}}}
    spec = obj["spec"]["spec"] if obj["kind"] == "ResourceClaimTemplate" else obj["spec"]
    spec["devices"]["config"] = [{**({"requests": requests} if requests else {}), **entry}]
    return obj


def test_a_config_above_its_requests_ask_is_warned():
    """The plugin takes the smaller of the allocation and the config: 8Gi on a 2Gi request gets 2Gi."""
    obj = configured(claim(ask(memory="2Gi", compute="20")), {"memoryLimit": "8Gi"})
    assert verdicts(WARN, "resourceclaims", obj) == [
        "spec.devices.config[0].opaque.parameters.memoryLimit: more than request 'r0' asks (2Gi): the claim's "
        "limit is the smaller, 2Gi; a config lowers what a claim is allocated, never raises it (got '8Gi')"]
    assert verdict(DENY, "resourceclaims", obj) is None
    obj = configured(template(ask(memory="2Gi", compute="20")), {"computeLimit": 50})
    assert verdicts(WARN, "resourceclaimtemplates", obj) == [
        "spec.spec.devices.config[0].opaque.parameters.computeLimit: more than request 'r0' asks (20): the "
        "claim's limit is the smaller, 20 %; a config lowers what a claim is allocated, never raises it (got 50)"]
    # bytes as an integer; a subrequest named as configs name it; beside a request warning of its own
    obj = configured(claim(ask(memory="4G", compute="10"), [ask(memory="1Gi", compute="5"), ask(memory="4Gi",
                                                                                                compute="5")]),
                     {"memoryLimit": 6 * 2**30}, requests=["r1/s1"])
    warned = verdicts(WARN, "resourceclaims", obj)
    assert len(warned) == 2 and "4000000000 bytes is not a multiple of 256Mi" in warned[0], warned
    assert warned[1] == (
        "spec.devices.config[0].opaque.parameters.memoryLimit: more than request 'r1/s1' asks (4Gi): the "
        "claim's limit is the smaller, 4Gi; a config lowers what a claim is allocated, never raises it "
        "(got '6442450944')"), warned


@pytest.mark.parametrize("parameters,requests", [
    ({"memoryLimit": "1Gi", "computeLimit": 10}, None),  # below the ask: lowers it, as meant
    ({"memoryLimit": "2Gi"}, None),  # equal
    ({"memoryLimit": "8Gi"}, ["other"]),  # another request's config
    ({"memoryLimit": "8Gi", "computeLimit": 90}, ["r1"]),  # r1 asks no capacity: a whole GPU, which it lowers
    ({"memoryLimit": "8Gx"}, None),  # not a quantity: gpushare.dev-config refuses it
])
def test_a_config_within_its_requests_is_not_warned(parameters, requests):
    obj = configured(claim(ask(memory="2Gi", compute="20"), ask()), parameters, requests)
    assert verdicts(WARN, "resourceclaims", obj) == []


def pod_verdict(modes: str | None, **limits: int) -> str | None:
    """gpushare.dev-pod-warnings on a pod whose container asks limits, with the DeviceClass
    gpushare.dev annotated with the modes the nodes publish (None: not yet written)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{"name": "app", "image": "x", "resources": {
               "limits": {k.replace("_", "/"): v for k, v in limits.items()}}}]}}
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": DRIVER, **({"annotations": {"gpushare.dev/sharing-modes": modes}}
                                                    if modes is not None else {})}}
    request = admission.request_attributes("", "v1", "pods", "Pod", "CREATE", "default", "p")
    [decision] = admission.validate(POD_WARN["spec"], admission.activation(POD_WARN["spec"], pod, None, request,
                                                                           params=device_class))
    assert not decision.error, decision
    return decision.message if decision.denied else None


def test_a_pod_asking_shares_of_a_capacity_mode_cluster_is_warned():
    assert pod_verdict("capacity", **{"gpushare.dev_share": 1}) == (
        "container 'app': gpushare.dev/share asks for partition-mode shares, but the nodes of this cluster publish "
        "capacity-mode GPUs only (annotation gpushare.dev/sharing-modes of DeviceClass gpushare.dev: 'capacity'), "
        "so the pod stays Pending; ask a ResourceClaim with capacity (memory, compute) for a share of a GPU, or "
        "gpushare.dev/gpu for whole GPUs")
    assert pod_verdict("partition", **{"gpushare.dev_gpu": 1}) == (
        "container 'app': gpushare.dev/gpu asks for whole capacity-mode GPUs, but the nodes of this cluster publish "
        "partition-mode shares only (annotation gpushare.dev/sharing-modes of DeviceClass gpushare.dev: "
        "'partition'), so the pod stays Pending; ask gpushare.dev/share for shares, or a ResourceClaim for "
        "DeviceClass gpushare.dev")


@pytest.mark.parametrize("modes,limits", [
    ("partition", {"gpushare.dev_share": 1}), ("capacity", {"gpushare.dev_gpu": 1}),
    ("capacity,partition", {"gpushare.dev_share": 2}),  # some node serves it
    (None, {"gpushare.dev_share": 1}),  # no plugin has said yet
    ("capacity", {"nvidia.com_gpu": 1}), ("capacity", {})])
def test_a_pod_some_node_can_serve_is_not_warned(modes, limits):
    assert pod_verdict(modes, **limits) is None


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
    assert bindings == {"gpushare.dev-requests": ["Deny"], "gpushare.dev-requests-warnings": ["Warn"],
                        "gpushare.dev-pod-warnings": ["Warn"]}
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
