"""The memory ceiling of gpushare.dev-requests follows the cluster: each node's controller writes
its largest GPU's memory onto the DeviceClass gpushare.dev (annotation
gpushare.dev/largest-gpu-memory; dra_driver/controller/ceiling.py), which the policy reads as its
param, so a 200Gi ask on 80Gi GPUs is refused at apply time instead of waiting at scheduling.

On the API emulator (which evaluates the policy's CEL with the binding's paramRef as the real
server does) and with the real kubectl. A real cluster must confirm the paramRef (tests/cluster)."""

from __future__ import annotations

import json

import yaml
from kubernetes import client

from dra_driver.controller import SliceController
from dra_driver.controller.ceiling import ANNOTATION, CAPACITY_ANNOTATION, MODES_ANNOTATION, MemoryCeiling, largest
from dra_driver.discovery import GpuInfo
from playground.emulator import admission
from tests.support import wait_for
from tests.support.deploy import DEPLOY
from tests.support.kubectl import Kubectl, needs_kubectl
from tests.support.slices import Gpus

GiB = 2**30
POLICIES = DEPLOY / "base" / "admission-requests.yaml"
DOCS = [d for d in yaml.safe_load_all(POLICIES.read_text()) if d]
DENY = next(d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy"
            and d["metadata"]["name"] == "gpushare.dev-requests")
CLASS = yaml.safe_load((DEPLOY / "base" / "deviceclass.yaml").read_text())


def gpu(index: int, memory: int) -> GpuInfo:
    return GpuInfo(index, f"GPU-{index}", index, "NVIDIA H100 80GB HBM3", memory, "Hopper", "9.0", "580.65.06", "13.0")


def claim(memory: str) -> dict:
    return {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpushare.dev", "capacity": {"requests": {"memory": memory, "compute": "10"}}}}]}}}


def verdict(obj: dict, params: dict) -> str | None:
    request = admission.request_attributes("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", "CREATE",
                                           "default", "c")
    [decision] = admission.validate(DENY["spec"], admission.activation(DENY["spec"], obj, None, request, params))
    assert not decision.error, decision
    return decision.message if decision.denied else None


def annotated(value: str | None) -> dict:
    c = yaml.safe_load(yaml.safe_dump(CLASS))
    if value is not None:
        c["metadata"]["annotations"] = {ANNOTATION: value}
    return c


def test_the_policy_reads_the_largest_gpu_from_the_class():
    assert verdict(claim("80Gi"), annotated("80Gi")) is None
    assert verdict(claim("200Gi"), annotated("80Gi")) == (
        "spec.devices.requests[0].exactly.capacity.requests.memory: more than the largest GPU has (80Gi, the "
        "largest GPU of this cluster's nodes: annotation gpushare.dev/largest-gpu-memory of DeviceClass "
        "gpushare.dev); no GPU can hold it (got '200Gi')")


def test_without_the_annotation_the_constant_stands():
    for params in (annotated(None), annotated("lots")):
        assert verdict(claim("200Gi"), params) is None
        assert verdict(claim("300Gi"), params) == (
            "spec.devices.requests[0].exactly.capacity.requests.memory: more than the largest GPU has (288Gi, the "
            "largest GPU made; no node has published its GPUs yet); no GPU can hold it (got '300Gi')")


def test_the_binding_names_the_class_and_lets_writes_through_without_it():
    [binding] = [d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicyBinding"
                 and d["metadata"]["name"] == "gpushare.dev-requests"]
    assert DENY["spec"]["paramKind"] == {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass"}
    assert binding["spec"]["paramRef"] == {"name": CLASS["metadata"]["name"], "parameterNotFoundAction": "Allow"}


def test_the_plugin_may_write_only_that_class():
    rbac = [d for d in yaml.safe_load_all((DEPLOY / "base" / "rbac.yaml").read_text()) if d]
    [role] = [d for d in rbac if d["kind"] == "ClusterRole"]
    [rule] = [r for r in role["rules"] if "deviceclasses" in r["resources"]]
    assert rule == {"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"],
                    "resourceNames": ["gpushare.dev"], "verbs": ["get", "patch"]}


def test_largest_is_the_published_maximum():
    assert largest([gpu(0, 80 * GiB), gpu(1, 141 * GiB + 12345)]) == 141 * GiB  # rounded down to the 256Mi step
    assert largest([]) is None


def test_the_annotation_only_grows_and_is_looked_at_again(emulator):
    api = emulator.api_client()
    _create_class(api)
    now = [0.0]
    a = MemoryCeiling(api, "gpushare.dev", "node-a", clock=lambda: now[0])
    b = MemoryCeiling(api, "gpushare.dev", "node-b", clock=lambda: now[0])
    a.raise_to([gpu(0, 80 * GiB)])
    assert _annotation(api) == "80Gi"
    b.raise_to([gpu(0, 40 * GiB)])  # smaller: left alone
    assert _annotation(api) == "80Gi"
    b.raise_to([gpu(0, 141 * GiB)])  # a node's GPUs changed: larger
    assert _annotation(api) == "141Gi"
    _patch(api, {"metadata": {"annotations": {ANNOTATION: None}}})  # an operator resets it
    a.raise_to([gpu(0, 80 * GiB)])
    assert _annotation(api) is None  # nothing changed on node-a, no look due yet
    now[0] += 601
    a.raise_to([gpu(0, 80 * GiB)])
    assert _annotation(api) == "80Gi"


def test_each_nodes_sharing_mode_is_added_to_the_class(emulator):
    """For gpushare.dev-pod-warnings: the modes the cluster's nodes publish, each added once."""
    api = emulator.api_client()
    _create_class(api)

    def modes():
        return _annotations(api).get(MODES_ANNOTATION)
    MemoryCeiling(api, "gpushare.dev", "node-a").raise_to([gpu(0, 80 * GiB)], True, None)  # "auto": not yet known
    assert modes() is None
    MemoryCeiling(api, "gpushare.dev", "node-a").raise_to([gpu(0, 80 * GiB)], True, "capacity")
    assert modes() == "capacity"
    MemoryCeiling(api, "gpushare.dev", "node-b").raise_to([gpu(0, 80 * GiB)], True, "partition")
    assert modes() == "capacity,partition"
    MemoryCeiling(api, "gpushare.dev", "node-c").raise_to([gpu(0, 80 * GiB)], True, "capacity")
    assert modes() == "capacity,partition"


def test_without_the_class_nothing_fails(emulator):
    MemoryCeiling(emulator.api_client(), "gpushare.dev", "node-a").raise_to([gpu(0, 80 * GiB)])  # logged, not raised


def test_the_controller_publishes_it(emulator, tmp_path):
    api = emulator.api_client()
    _create_class(api)
    controller = SliceController(api, "gpushare.dev", "node-a", Gpus(tmp_path / "gpus.yaml").backend(),
                                 gpu_poll_interval=0.2).start()
    try:
        wait_for(lambda: _annotation(api) == "80Gi", timeout=20)
    finally:
        controller.stop()


@needs_kubectl
def test_kubectl_apply_refuses_more_than_the_clusters_largest_gpu(emulator, tmp_path):
    k = Kubectl(tmp_path, kubeconfig=emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    k("apply", "-f", POLICIES, "-f", DEPLOY / "base" / "deviceclass.yaml")
    MemoryCeiling(emulator.api_client(), "gpushare.dev", "node-a").raise_to([gpu(0, 80 * GiB), gpu(1, 80 * GiB)])
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "big"}, **claim("200Gi")}
    out = k.run("apply", "-f", "-", input=yaml.safe_dump(body), check=False)
    assert out.returncode != 0
    assert "more than the largest GPU has (80Gi, the largest GPU of this cluster's nodes" in out.stderr
    body["metadata"]["name"], body["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = \
        "fits", "80Gi"
    assert k("apply", "-f", "-", input=yaml.safe_dump(body)).strip() == "resourceclaim.resource.k8s.io/fits created"


def _create_class(api) -> None:
    client.ResourceV1Api(api).create_device_class(CLASS)


def _patch(api, body: dict) -> None:
    client.ResourceV1Api(api).patch_device_class("gpushare.dev", body, _content_type="application/merge-patch+json")


def _annotation(api) -> str | None:
    c = client.ResourceV1Api(api).read_device_class("gpushare.dev", _preload_content=False)
    return (json.loads(c.data)["metadata"].get("annotations") or {}).get(ANNOTATION)


def test_the_capacity_gate_is_published_too(emulator):
    api = emulator.api_client()
    _create_class(api)
    now = [0.0]
    ceiling = MemoryCeiling(api, "gpushare.dev", "node-a", clock=lambda: now[0])
    ceiling.raise_to([gpu(0, 80 * GiB)], capacity_kept=False)
    assert _annotations(api) == {ANNOTATION: "80Gi", CAPACITY_ANNOTATION: "false"}
    ceiling.raise_to([gpu(0, 80 * GiB)], capacity_kept=True)  # the gate turned on (a new server)
    assert _annotations(api)[CAPACITY_ANNOTATION] == "true"


def test_the_controller_publishes_what_the_server_keeps(make_emulator, tmp_path):
    emu = make_emulator(consumable_capacity=False)
    api = emu.api_client()
    _create_class(api)
    controller = SliceController(api, "gpushare.dev", "node-a", Gpus(tmp_path / "gpus.yaml").backend(),
                                 gpu_poll_interval=0.2).start()
    try:
        wait_for(lambda: _annotations(api).get(CAPACITY_ANNOTATION) == "false", timeout=20)
    finally:
        controller.stop()


@needs_kubectl
def test_without_the_gate_the_author_is_told_at_apply_time(make_emulator, tmp_path):
    """1.34/1.35 without DRAConsumableCapacity: the server drops `capacity` before admission, so
    the policy cannot see the ask; it warns about a plain request (no count) to gpushare.dev."""
    emu = make_emulator(consumable_capacity=False)
    k = Kubectl(tmp_path, kubeconfig=emu.write_kubeconfig(tmp_path / "kubeconfig"))
    k("apply", "-f", POLICIES, "-f", DEPLOY / "base" / "deviceclass.yaml")
    MemoryCeiling(emu.api_client(), "gpushare.dev", "node-a").raise_to([gpu(0, 80 * GiB)], capacity_kept=False)
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "asked"},
            **claim("4Gi")}
    out = k.run("apply", "-f", "-", input=yaml.safe_dump(body))
    assert out.stdout.strip() == "resourceclaim.resource.k8s.io/asked created"
    assert ("spec.devices.requests[0].exactly: this cluster's API server drops capacity requests (no "
            "DRAConsumableCapacity: Kubernetes 1.34/1.35 without the feature gate), so the request gets one "
            "partition-mode share") in out.stderr
    shares = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "shares"},
              "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                  "deviceClassName": "gpushare.dev", "allocationMode": "ExactCount", "count": 2}}]}}}
    out = k.run("apply", "-f", "-", input=yaml.safe_dump(shares))
    assert (out.stdout.strip(), out.stderr) == ("resourceclaim.resource.k8s.io/shares created", "")


def _annotations(api) -> dict:
    c = client.ResourceV1Api(api).read_device_class("gpushare.dev", _preload_content=False)
    return json.loads(c.data)["metadata"].get("annotations") or {}
