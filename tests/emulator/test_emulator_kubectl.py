"""The README's kubectl steps, with the real kubectl, against `gpushare-dra emulator`.

The emulator runs as an operator starts it (`gpushare-dra emulator --port 0
--kubeconfig-out FILE`) and kubectl only ever uses that FILE. kubectl calls cost ~0.2 s
each, so the steps share one emulator and batch what they can.
"""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.support.kubectl import Kubectl, needs_kubectl

pytestmark = needs_kubectl

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
# The examples' folders (deploy/examples/e2e is hack/e2e-kind.sh's scenario; no object of one
# set has the name of another's, so all apply in one go: test_examples_and_e2e_apply_together).
# extended-resources/ is applied there only: a second apply of a pod with extended-resource
# limits is `configured`, on the real API server (1.37.2, 2026-11-28) as on the emulator: kubectl's
# three-way patch compares the file's number 1 with the stored quantity "1".
EXAMPLES = sorted(p for p in (DEPLOY / "examples").glob("*/*.yaml")
                  if p.parent.name not in ("e2e", "extended-resources"))


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("kubectl")
    kubeconfig = workdir / "emulator.kubeconfig"
    emulator = subprocess.Popen([sys.executable, "-m", "dra_driver.cli", "emulator", "--port", "0",
                                 "--kubeconfig-out", str(kubeconfig), "--log-format", "json"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # imports take seconds on a loaded machine
        while not kubeconfig.exists() and emulator.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        state = emulator.stderr.read() if emulator.poll() is not None else "still starting"
        assert kubeconfig.exists(), f"the emulator wrote no kubeconfig: {state}"
        yield Kubectl(workdir, kubeconfig=kubeconfig)
    finally:
        emulator.terminate()
        emulator.wait(timeout=30)


def node_and_slice(kubectl) -> None:
    """Node node-a and the ResourceSlice the slice controller publishes for it (owned by it)."""
    kubectl("apply", "-f", "-", input="apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n")
    uid = kubectl("get", "node", "node-a", "-o", "jsonpath={.metadata.uid}")
    kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpushare.dev", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": uid}]},
        "spec": {"driver": "gpushare.dev", "nodeName": "node-a",
                 "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {"index": {"int": 0}},
                              "capacity": {"memory": {"value": "80Gi"}}}]}}))


@pytest.fixture(scope="module")
def deployed(kubectl):
    """The install and the examples, as the README has them: {step: kubectl's output}."""
    out = {"mock": kubectl("apply", "-k", DEPLOY / "overlays" / "mock")}
    node_and_slice(kubectl)
    out["examples"] = kubectl("apply", *(a for p in EXAMPLES for a in ("-f", p)))
    return out


def table(text: str) -> list[dict]:
    """kubectl's table output as rows of {HEADER: cell}."""
    lines = text.strip().splitlines()
    # Columns are at least three spaces apart; a header may have one inside ("NODE SELECTOR").
    starts = [i for i, ch in enumerate(lines[0]) if ch != " " and (i == 0 or lines[0][i - 2:i] == "  ")]
    bounds = list(zip(starts, starts[1:] + [None], strict=True))

    def cells(line):
        return [line[a:b].strip() for a, b in bounds]

    return [dict(zip(cells(lines[0]), cells(line), strict=True)) for line in lines[1:]]


def test_health_endpoints(kubectl):
    assert [kubectl("get", "--raw", f"/{p}") for p in ("healthz", "readyz", "livez")] == ["ok"] * 3


def test_apply_k_creates_every_kind_and_reapplies_unchanged(kubectl, deployed):
    created = deployed["mock"].splitlines()
    for expected in ("namespace/gpushare-system created", "serviceaccount/gpushare-dra created",
                     "clusterrole.rbac.authorization.k8s.io/gpushare-dra created",
                     "clusterrolebinding.rbac.authorization.k8s.io/gpushare-dra created",
                     "daemonset.apps/gpushare-kubelet-plugin created",
                     "deviceclass.resource.k8s.io/gpushare.dev created"):
        assert expected in created, deployed["mock"]
    again = kubectl("apply", "-k", DEPLOY / "overlays" / "mock").splitlines()
    assert again and all(line.endswith(" unchanged") for line in again), again


def test_switching_overlays_patches_the_daemonset_to_the_rendering(kubectl, deployed):
    """From the mock overlay to deploy/: kubectl's strategic merge patch (list items deleted
    by key, $setElementOrder) must leave exactly what kustomize renders."""
    try:
        out = kubectl("apply", "-k", DEPLOY)
        assert "daemonset.apps/gpushare-kubelet-plugin configured" in out, out
        (rendered,) = [o for o in kubectl.objects("kustomize", DEPLOY) if o["kind"] == "DaemonSet"]
        stored = json.loads(kubectl("-n", "gpushare-system", "get", "ds", "gpushare-kubelet-plugin",
                                    "-o", "json"))
        assert stored["spec"] == rendered["spec"], json.dumps([stored["spec"], rendered["spec"]])
    finally:
        kubectl("apply", "-k", DEPLOY / "overlays" / "mock")


def test_examples_are_created(deployed):
    lines = deployed["examples"].splitlines()
    assert "resourceclaim.resource.k8s.io/team-gpu created" in lines
    assert "resourceclaimtemplate.resource.k8s.io/gpu-10gi-30pct created" in lines
    assert "pod/trainer created" in lines
    assert all(line.endswith((" created", " unchanged", " configured")) for line in lines), lines


def test_get_prints_the_real_servers_columns(kubectl, deployed):
    # An allocation as the scheduler writes it, reserved for a pod: STATE says both.
    status = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpushare.dev", "pool": "node-a", "device": "gpu-0"}]}},
        "reservedFor": [{"resource": "pods", "name": "team-gpu-a", "uid": "1d2c0a5e-7a4b-4c3e-9f10-0c4f7a9b2e11"}]}}
    kubectl("patch", "resourceclaim", "team-gpu", "--subresource=status", "--type=merge", "-p",
            json.dumps(status))
    claims = {r["NAME"]: r for r in table(kubectl("get", "resourceclaims"))}
    assert list(claims["team-gpu"]) == ["NAME", "STATE", "AGE"]
    assert claims["team-gpu"]["STATE"] == "allocated,reserved"
    assert claims["whole-gpu"]["STATE"] == "pending"
    (slice_row,) = table(kubectl("get", "resourceslices"))
    assert slice_row.pop("AGE").endswith(("s", "m"))
    assert slice_row == {"NAME": "node-a-gpushare.dev", "NODE": "node-a", "DRIVER": "gpushare.dev",
                         "POOL": "node-a"}
    classes = table(kubectl("get", "deviceclasses"))
    assert all(list(c) == ["NAME", "AGE"] for c in classes)
    assert [c["NAME"] for c in classes] == ["gpu.gpushare.dev", "gpushare.dev", "mig.gpushare.dev",
                                            "mps.gpushare.dev", "share.gpushare.dev"]
    pods = {r["NAME"]: r for r in table(kubectl("get", "pods"))}
    assert list(pods["trainer"]) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert pods["trainer"]["READY"] == "0/1" and pods["trainer"]["STATUS"] == "Pending"
    assert pods["trainer"]["RESTARTS"] == "0" and pods["trainer"]["AGE"].endswith(("s", "m"))


def test_get_daemonset_prints_its_columns(kubectl, deployed):
    (row,) = table(kubectl("-n", "gpushare-system", "get", "daemonsets"))
    assert list(row) == ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR", "AGE"]
    assert row["NAME"] == "gpushare-kubelet-plugin" and row["NODE SELECTOR"] == "kubernetes.io/os=linux"


def test_get_watch_prints_rows_as_they_change(kubectl, deployed):
    watch = kubectl.popen("get", "resourceclaim", "whole-gpu", "-w")
    guard = threading.Timer(60, watch.kill)  # a watch that never prints must not hang the suite
    guard.start()
    try:
        lines = [watch.stdout.readline() for _ in range(2)]  # the header and the claim
        kubectl("label", "resourceclaim", "whole-gpu", "watched=yes")
        lines.append(watch.stdout.readline())
    finally:
        guard.cancel()
        watch.kill()
        watch.wait()
    assert lines[0].split() == ["NAME", "STATE", "AGE"]
    assert [line.split()[:2] for line in lines[1:]] == [["whole-gpu", "pending"]] * 2


def test_explain(kubectl):
    out = kubectl("explain", "resourceclaim.spec.devices.requests.exactly")
    assert "KIND:       ResourceClaim" in out and "VERSION:    v1" in out
    assert "deviceClassName\t<string> -required-" in out and "capacity\t<CapacityRequirements>" in out
    assert "DESCRIPTION:" in kubectl("explain", "resourceslices.spec.devices.capacity")


def test_server_side_apply(kubectl, deployed):
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "ssa", "namespace": "default", "labels": {"team": "a", "tier": "gold"}},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpushare.dev"}}]}}}
    assert kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(claim)).strip() == \
        "resourceclaim.resource.k8s.io/ssa serverside-applied"
    stored = json.loads(kubectl("get", "resourceclaim", "ssa", "-o", "json", "--show-managed-fields"))
    (managed,) = stored["metadata"]["managedFields"]
    assert managed["manager"] == "kubectl" and managed["operation"] == "Apply"
    assert "f:team" in managed["fieldsV1"]["f:metadata"]["f:labels"]
    del claim["metadata"]["labels"]["tier"]  # a field the manager stops applying goes
    kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(claim))
    assert json.loads(kubectl("get", "resourceclaim", "ssa", "-o", "json"))["metadata"]["labels"] == {"team": "a"}
    # The DeviceClass the client-side apply made, applied again server-side.
    out = kubectl("apply", "--server-side", "-f", DEPLOY / "base" / "deviceclass.yaml")
    assert out.strip() == "deviceclass.resource.k8s.io/gpushare.dev serverside-applied"


def test_claim_spec_is_immutable(kubectl, deployed):
    text = (DEPLOY / "examples" / "capacity" / "shared-claim.yaml").read_text()
    assert "memory: 8Gi" in text
    out = kubectl.run("apply", "-f", "-", input=text.replace("memory: 8Gi", "memory: 4Gi"), check=False)
    assert out.returncode != 0
    assert 'The ResourceClaim "team-gpu" is invalid: spec: Invalid value: field is immutable' in out.stderr
    assert "memory: 8Gi" in kubectl("get", "resourceclaim", "team-gpu", "-o", "yaml")


def claim(name, **exactly):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpushare.dev",
                                                                          **exactly}}]}}}


def test_examples_and_e2e_apply_together(kubectl, deployed):
    """Applying deploy/examples and then its e2e scenario (a reader trying each) never updates or
    conflicts with an object of the other set."""
    out = kubectl.run("apply", "-R", "-f", DEPLOY / "examples", check=False)
    assert out.returncode == 0, out.stderr
    assert not [line for line in out.stdout.splitlines() if line.endswith(" configured")], out.stdout


def test_invalid_objects_are_refused(kubectl, deployed):
    bad = [claim("lots", capacity={"requests": {"memory": "lots"}}),
           claim("zero", count=0),
           claim("broken-cel", selectors=[{"cel": {"expression": "device.driver =="}}]),
           {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stray-claim"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "shared-gpu"}],
                     "containers": [{"name": "c", "image": "busybox",
                                     "resources": {"claims": [{"name": "other"}]}}]}}]
    out = kubectl.run("apply", "-f", "-", input=yaml.safe_dump_all(bad), check=False)
    assert out.returncode != 0 and not out.stdout.strip(), out.stdout
    errors = out.stderr
    assert "quantities must match the regular expression" in errors and "'lots'" in errors
    assert 'ResourceClaim.resource.k8s.io "zero" is invalid: spec.devices.requests[0].exactly.count: ' \
           'Invalid value: 0: must be greater than zero' in errors
    assert 'spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value: ' \
           '"device.driver ==": compilation failed' in errors
    assert 'Pod "stray-claim" is invalid: spec.containers[0].resources.claims[0].name: Invalid value: ' \
           '"other": must be one of the names in pod.spec.resourceClaims: gpu' in errors
    assert kubectl.run("get", "resourceclaim", "lots", "zero", "broken-cel", check=False).stdout == ""


def test_field_validation(kubectl, deployed):
    body = claim("unknown-field")
    body["spec"]["bogus"] = 1
    text = yaml.safe_dump(body)
    strict = kubectl.run("apply", "-f", "-", input=text, check=False)  # kubectl's default: strict
    assert strict.returncode != 0 and 'strict decoding error: unknown field "spec.bogus"' in strict.stderr
    warned = kubectl.run("apply", "--validate=warn", "-f", "-", input=text)
    assert 'Warning: unknown field "spec.bogus"' in warned.stderr
    assert "bogus" not in kubectl("get", "resourceclaim", "unknown-field", "-o", "jsonpath={.spec}")
    ignored = kubectl.run("apply", "--validate=false", "-f", "-", input=text.replace("unknown-field", "ignored"))
    assert ignored.returncode == 0 and "Warning" not in ignored.stderr


def test_deleting_a_node_collects_its_slices(kubectl, deployed):
    assert kubectl("get", "resourceslices", "-o", "name").split() == [
        "resourceslice.resource.k8s.io/node-a-gpushare.dev"]
    kubectl("delete", "node", "node-a")
    assert kubectl("get", "resourceslices", "-o", "name") == ""


def test_uninstall(kubectl, deployed):
    assert kubectl("get", "all", "-n", "gpushare-system", "-o", "name").split() == [
        "service/gpushare-kubelet-plugin-metrics", "daemonset.apps/gpushare-kubelet-plugin"]
    # The namespace goes first and takes what is in it (at once here, where a real server
    # takes a moment): hence --ignore-not-found.
    kubectl("delete", "-k", DEPLOY / "overlays" / "mock", "--ignore-not-found")
    left = kubectl("get", "namespaces,serviceaccounts,services,daemonsets,clusterroles,clusterrolebindings,"
                   "deviceclasses,validatingadmissionpolicies,validatingadmissionpolicybindings",
                   "-A", "-o", "name")
    assert left == ""


def test_shipped_admission_policy_refuses_a_bad_config(kubectl):
    """With deploy/base/admission.yaml applied (`apply -k` applies it too), kubectl prints the
    policy's refusal as it does the real server's (422, a cause without a field)."""
    policy = DEPLOY / "base" / "admission.yaml"
    body = claim("over-limit")
    body["spec"]["devices"]["config"] = [{"opaque": {"driver": "gpushare.dev", "parameters": {
        "apiVersion": "gpushare.dev/v1alpha1", "kind": "GpuShareConfig", "computeLimit": 120}}}]
    kubectl("apply", "-f", policy)
    try:
        out = kubectl.run("apply", "-f", "-", input=yaml.safe_dump(body), check=False)
    finally:
        kubectl("delete", "-f", policy)
    assert out.returncode != 0, out.stdout
    assert out.stderr.strip() == (
        'The resourceclaims "over-limit" is invalid: : ValidatingAdmissionPolicy \'gpushare.dev-config\' '
        "with binding 'gpushare.dev-config' denied request: spec.devices.config[0].opaque.parameters."
        "computeLimit: must be a percentage from 1 to 100 (got 120)")
    assert kubectl.run("get", "resourceclaim", "over-limit", check=False).stdout == ""
