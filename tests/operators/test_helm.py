"""deploy/helm/gpushare-dra: `helm lint` passes, and `helm template` renders what `kubectl
kustomize` renders from deploy/ (the same DaemonSet, policies, classes, RBAC and Service; the
chart adds Helm's labels), with each value an operator sets matching the deploy/ component or
overlay that does the same.

Needs a real helm: on PATH, or built into .cache/tools with hack/helm (Go and the Go module
proxy); the tests skip, saying so, without one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.support import REPO
from tests.support.deploy import DEPLOY, VERSIONS, plugin_container
from tests.support.kubectl import Kubectl, needs_kubectl

CHART = DEPLOY / "helm" / "gpushare-dra"
HELM = shutil.which("helm") or next((str(p) for p in [REPO / ".cache" / "tools" / "helm"] if os.access(p, os.X_OK)),
                                    None)
needs_helm = pytest.mark.skipif(HELM is None, reason="helm is not on PATH nor in .cache/tools: build it with "
                                "hack/helm (go install helm.sh/helm/v3/cmd/helm@v3.22.0, from the Go module proxy)")
pytestmark = [needs_helm, needs_kubectl]
NAMESPACE = "gpushare-system"
COPIED_KINDS = {"DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
HELM_LABELS = {"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
               "helm.sh/chart"}


def helm(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "HELM_CACHE_HOME": str(tmp_path / "cache"),
           "HELM_CONFIG_HOME": str(tmp_path / "config"), "HELM_DATA_HOME": str(tmp_path / "data")}
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """template(*values) -> the chart's objects, release `gpushare-dra` in gpushare-system; a
    value is a --set argument, or a whole option (`--set-json=...`). Hooks (Helm's own, with no
    kustomize equivalent: the uninstall check) are left out unless hooks=True."""
    home = tmp_path_factory.mktemp("helm")

    def render(*values: str, hooks: bool = False) -> list[dict]:
        sets = [a for v in values for a in ((v,) if v.startswith("--") else ("--set", v))]
        out = helm(home, "template", "gpushare-dra", str(CHART), "--namespace", NAMESPACE, "--kube-version", "1.34.0",
                   *sets)
        assert out.returncode == 0, out.stderr
        return [d for d in yaml.safe_load_all(out.stdout)
                if d and (hooks or "helm.sh/hook" not in (d["metadata"].get("annotations") or {}))]

    return render


@pytest.fixture(scope="module")
def kustomize(tmp_path_factory):
    kubectl = Kubectl(tmp_path_factory.mktemp("kubectl"))

    def render(folder: Path) -> list[dict]:
        return kubectl.objects("kustomize", folder)

    return render


def keyed(objects: list[dict]) -> dict[tuple[str, str], dict]:
    """Objects by kind and name, without their own labels (same_objects compares those), runs of
    white space in strings as one space: kustomize's YAML parser keeps a blank line where a folded
    scalar (`>-`) has a more-indented line, Helm's does not (the same CEL either way)."""
    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return " ".join(value.split()) if isinstance(value, str) else value

    out = {}
    for o in objects:
        o = plain(o)
        o["metadata"].pop("labels", None)
        if o["kind"] == "DaemonSet":  # a kustomize patch puts the volume it changes first
            o["spec"]["template"]["spec"]["volumes"].sort(key=lambda v: v["name"])
        out[(o["kind"], o["metadata"]["name"])] = o
    return out


def same_objects(chart: list[dict], kust: list[dict]) -> None:
    """The same objects; the chart's labels are deploy/'s plus Helm's own (instance, version, ...)."""
    a, b = keyed(chart), keyed(kust)
    assert a.keys() == b.keys()
    for key in b:
        assert a[key] == b[key], key
    labels = {(o["kind"], o["metadata"]["name"]): o["metadata"].get("labels") or {} for o in chart}
    for o in kust:
        mine = labels[(o["kind"], o["metadata"]["name"])]
        assert (o["metadata"].get("labels") or {}).items() <= mine.items()
        if o["kind"] not in COPIED_KINDS:  # deploy/'s files as they are
            assert HELM_LABELS <= mine.keys()


# The chart's files/ are copies of deploy/'s files, kept equal here (a fix in deploy/base must be
# the chart's too). Copies, not links: Helm prints a "found symbolic link" line per link at every
# `helm install` from the folder.
COPIES = {"admission.yaml": "base/admission.yaml", "admission-requests.yaml": "base/admission-requests.yaml",
         "deviceclass.yaml": "base/deviceclass.yaml", "deviceclass-extended.yaml": "base/deviceclass-extended.yaml",
         "deviceclass-mps.yaml": "base/deviceclass-mps.yaml", "node-restriction.yaml": "base/node-restriction.yaml"}


@pytest.mark.parametrize("copy,original", COPIES.items())
def test_the_charts_files_are_deploys(copy, original):
    path = CHART / "files" / copy
    assert not path.is_symlink(), f"{path}: a copy, not a link (Helm warns about every link)"
    assert path.read_bytes() == (DEPLOY / original).read_bytes(), \
        f"{path} differs from deploy/{original}: cp deploy/{original} {path.relative_to(REPO)}"


def test_helm_template_prints_no_symbolic_link_lines(tmp_path):
    out = helm(tmp_path, "template", "gpushare-dra", str(CHART), "--kube-version", "1.34.0")
    assert out.returncode == 0, out.stderr
    assert "symbolic link" not in out.stderr, out.stderr


def test_lint_passes_with_defaults_and_every_option(tmp_path):
    for values in ([], ["mock.enabled=true", "serviceMonitor.enabled=true", "networkPolicy.enabled=true",
                        "nodeRestriction.enabled=false", "namespace.create=true", "driverRoot=/run/nvidia/driver"]):
        sets = [a for v in values for a in ("--set", v)]
        out = helm(tmp_path, "lint", "--strict", str(CHART), *sets)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_daemonset_is_the_one_kustomize_renders(template, kustomize):
    """The defaults (image tag set as deploy/ sets it) give deploy/'s DaemonSet, field for field."""
    chart, kust = keyed(template("image.tag=dev")), keyed(kustomize(DEPLOY))
    assert chart[("DaemonSet", "gpushare-kubelet-plugin")] == kust[("DaemonSet", "gpushare-kubelet-plugin")]


def test_every_other_object_is_the_one_kustomize_renders(template, kustomize):
    same_objects(template("image.tag=dev", "namespace.create=true"), kustomize(DEPLOY))


def test_mock_is_the_mock_overlay(template, kustomize):
    chart = keyed(template("image.tag=dev", "mock.enabled=true"))
    kust = keyed(kustomize(DEPLOY / "overlays" / "mock"))
    assert chart[("DaemonSet", "gpushare-kubelet-plugin")] == kust[("DaemonSet", "gpushare-kubelet-plugin")]


@pytest.mark.parametrize("value,component", [
    ("serviceMonitor.enabled=true", "servicemonitor"), ("networkPolicy.enabled=true", "network-policy"),
    ("driverRoot=/run/nvidia/driver", "gpu-operator"),
    ("nodeSelector.gpushare\\.dev/node=true", "node-label")])
def test_each_option_is_its_component(template, kustomize, tmp_path, value, component):
    overlay = tmp_path / "overlay"
    shutil.copytree(DEPLOY, tmp_path / "deploy", ignore=shutil.ignore_patterns("overlays", "examples", "helm"))
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["../deploy"], "components": [f"../deploy/components/{component}"]}))
    same_objects(template("image.tag=dev", "namespace.create=true", value), kustomize(overlay))


def test_kubelet_dir_moves_every_place_of_each_folder(template):
    pod, container = plugin_container(template("kubeletDir=/var/lib/k0s/kubelet"))
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    for name, var, path in (("plugin-dir", "GPUSHARE_PLUGIN_DIR", "/var/lib/k0s/kubelet/plugins/gpushare.dev"),
                            ("registry-dir", "GPUSHARE_REGISTRY_DIR", "/var/lib/k0s/kubelet/plugins_registry")):
        assert paths[name] == mounts[name] == env[var] == path


def test_operator_settings_land_where_they_belong(template):
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In",
                               "values": ["true"]}]}]}}}
    objects = template("image.repository=registry.example.com/gpushare-dra", "image.tag=1.2.3",
                       "priorityClassName=gpu-critical", "plugin.resources.limits.memory=1Gi",
                       "plugin.livenessProbe.timeoutSeconds=30", "plugin.extraArgs={--partitions=4}",
                       "plugin.healthIgnoreXids=63\\,92", "nodeSelector=null",
                       f"--set-json=affinity={json.dumps(affinity)}",
                       "tolerations[0].operator=Exists", "admissionPolicies.largestGpu=80Gi")
    pod, container = plugin_container(objects)
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {
        "registry.example.com/gpushare-dra:1.2.3"}
    assert pod["priorityClassName"] == "gpu-critical"
    assert container["resources"]["limits"]["memory"] == "1Gi"
    assert container["livenessProbe"]["timeoutSeconds"] == 30
    assert container["args"][-2:] == ["--health-ignore-xids=63,92", "--partitions=4"]
    assert "nodeSelector" not in pod and pod["affinity"] == affinity
    assert pod["tolerations"] == [{"operator": "Exists"}]
    [requests] = [o for o in objects if o["metadata"]["name"] == "gpushare.dev-requests"
                  and o["kind"] == "ValidatingAdmissionPolicy"]
    assert {"name": "fallbackLargestGpu", "expression": "'80Gi'"} in requests["spec"]["variables"]


def test_without_admission_policies_none_is_rendered(template):
    """admissionPolicies: the claim checks; the plugin's own-node restriction has its own switch."""
    def policies(*values):
        return sorted((o["kind"], o["metadata"]["name"]) for o in template(*values)
                      if o["kind"].startswith("ValidatingAdmissionPolicy"))
    own_node = [("ValidatingAdmissionPolicy", "gpushare.dev-own-node-slices"),
                ("ValidatingAdmissionPolicyBinding", "gpushare.dev-own-node-slices")]
    assert policies("admissionPolicies.enabled=false") == own_node
    assert policies("admissionPolicies.enabled=false", "nodeRestriction.enabled=false") == []
    assert set(own_node) < set(policies())  # on by default, as in deploy/base


@pytest.mark.parametrize("version", VERSIONS)
def test_rendered_objects_are_valid(template, version):
    for obj in template("mock.enabled=true", "networkPolicy.enabled=true", "namespace.create=true"):
        kubernetes_validate.validate(obj, version, strict=True)


def test_uninstall_runs_the_check_as_a_pre_delete_hook_that_prints_its_log(template):
    hooks = {(o["kind"], o["metadata"]["name"]): o for o in template(hooks=True)
             if "helm.sh/hook" in (o["metadata"].get("annotations") or {})}
    assert set(hooks) == {(k, "gpushare-dra-uninstall-check") for k in
                          ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job")}
    assert {o["metadata"]["annotations"]["helm.sh/hook"] for o in hooks.values()} == {"pre-delete"}
    job = hooks[("Job", "gpushare-dra-uninstall-check")]
    assert job["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-failed"
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["uninstall-check", "--log-format", "json", "--daemonset",
                                 f"{NAMESPACE}/gpushare-kubelet-plugin", "--timeout", "240"]
    assert hooks[("ClusterRole", "gpushare-dra-uninstall-check")]["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]
    assert hooks[("Role", "gpushare-dra-uninstall-check")]["rules"] == [
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": ["gpushare-kubelet-plugin"],
         "verbs": ["get"]}]
    forced = {(o["kind"], o["metadata"]["name"]): o for o in template("uninstall.force=true", hooks=True)}
    [container] = forced[("Job", "gpushare-dra-uninstall-check")]["spec"]["template"]["spec"]["containers"]
    assert container["args"][-1] == "--force"
    assert not [o for o in template("uninstall.check=false", hooks=True)
                if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]
