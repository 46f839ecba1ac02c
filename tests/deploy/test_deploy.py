"""deploy/: base and every overlay render with the real `kubectl kustomize`, and every
rendered object is valid Kubernetes."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.support.deploy import DEPLOY, VERSIONS, by_name, plugin_container
from tests.support.kubectl import Kubectl, needs_kubectl

ROOT = Path(__file__).parents[2]
# Every folder with a kustomization: each must render on its own.
# Every folder that renders on its own: a kustomize Component (deploy/components/) only
# renders from an overlay that includes it (tests/deploy/test_deploy_metrics.py does).
KUSTOMIZATIONS = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml")
                        if yaml.safe_load(p.read_text()).get("kind") != "Component")
MOCK = DEPLOY / "overlays" / "mock"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """{folder: objects}: `kubectl kustomize` of every kustomization folder."""
    kubectl = Kubectl(tmp_path_factory.mktemp("kubectl"))
    return {folder: kubectl.objects("kustomize", folder) for folder in KUSTOMIZATIONS}


def test_every_overlay_is_found():
    assert {DEPLOY, DEPLOY / "base", MOCK} <= set(KUSTOMIZATIONS)


@needs_kubectl
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(ROOT)))
def test_rendered_objects_are_valid(rendered, folder, version):
    objects = rendered[folder]
    assert {"DaemonSet", "DeviceClass", "ClusterRole", "ServiceAccount", "Namespace"} <= {o["kind"] for o in objects}
    for o in objects:
        kubernetes_validate.validate(o, version, strict=True)


@needs_kubectl
def test_daemonset_has_what_the_plugin_needs(rendered):
    pod, plugin = plugin_container(rendered[DEPLOY])
    mounts = by_name(plugin["volumeMounts"])
    volumes = by_name(pod["volumes"])
    assert {"/var/lib/kubelet/plugins/gpushare.dev", "/var/lib/kubelet/plugins_registry", "/var/run/cdi",
            "/var/lib/gpushare", "/opt/gpushare/lib"} <= {m["mountPath"] for m in mounts.values()}
    # the claims' region tmpfs the plugin mounts reach the host's container runtime
    assert mounts["state-dir"]["mountPropagation"] == "Bidirectional" and plugin["securityContext"]["privileged"]
    env = by_name(plugin["env"])
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert plugin["livenessProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    # a slow start (many claims to recover) is not killed by the liveness probe
    assert plugin["startupProbe"]["grpc"] == plugin["livenessProbe"]["grpc"]
    startup = plugin["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert pod["serviceAccountName"] == "gpushare-dra"
    assert pod["initContainers"][0]["args"][0] == "install-hook"
    # GPU nodes as NVIDIA's DRA driver chart finds them (NFD's labels, or nvidia.com/gpu.present)
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert "nodeSelector" not in pod and [t["matchExpressions"] for t in terms] == [
        [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}],
        [{"key": "feature.node.kubernetes.io/cpu-model.vendor_id", "operator": "In", "values": ["NVIDIA"]}],
        [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]]
    # the kubelet dials the paths the plugin registers: each folder is mounted at its host path
    for volume, variable in (("plugin-dir", "GPUSHARE_PLUGIN_DIR"), ("registry-dir", "GPUSHARE_REGISTRY_DIR")):
        assert volumes[volume]["hostPath"]["path"] == mounts[volume]["mountPath"] == env[variable]["value"]
    assert env["GPUSHARE_PLUGIN_DIR"]["value"] == "/var/lib/kubelet/plugins/gpushare.dev"  # the flag's default


@needs_kubectl
def test_daemonset_runs_on_plain_runc_with_the_driver_root_mounted(rendered):
    """NVML from the host's driver root, read-only, as NVIDIA's DRA driver does; no injection by
    the NVIDIA container runtime; both CDI folders, NVIDIA's static spec folder read-only."""
    pod, plugin = plugin_container(rendered[DEPLOY])
    env = by_name(plugin["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"
    assert not {"NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_VISIBLE_DEVICES"} & {
        e["name"] for c in pod["initContainers"] for e in c.get("env", [])}
    (root,) = [a.split("=", 1)[1] for a in plugin["args"] if a.startswith("--driver-root=")]
    mounts, volumes = by_name(plugin["volumeMounts"], "mountPath"), by_name(pod["volumes"])
    assert mounts[root]["readOnly"] is True and mounts[root]["mountPropagation"] == "HostToContainer"
    assert volumes[mounts[root]["name"]]["hostPath"] == {"path": "/", "type": "Directory"}
    assert mounts["/etc/cdi"]["readOnly"] is True
    assert volumes[mounts["/etc/cdi"]["name"]]["hostPath"]["path"] == "/etc/cdi"
    assert volumes[mounts["/var/run/cdi"]["name"]]["hostPath"]["path"] == "/var/run/cdi"
    assert not mounts["/var/run/cdi"].get("readOnly")  # the plugin writes its specs there


def test_image_is_named_in_one_place():
    """The manifests name the image without a tag; base/kustomization.yaml's `images:` sets it."""
    kustomization = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert kustomization["images"] == [{"name": "gpushare-dra", "newTag": "dev"}]
    manifests = [p for p in DEPLOY.rglob("*.yaml") if "examples" not in p.parts and "helm" not in p.parts
                 and p.name != "kustomization.yaml"]  # the chart: tests/operators/test_helm.py
    images = [c["image"] for p in manifests for d in docs(p) if d.get("kind") == "DaemonSet"
              for c in d["spec"]["template"]["spec"].get("containers", []) + d["spec"]["template"]["spec"].get(
                  "initContainers", []) if "image" in c]
    assert images == ["gpushare-dra", "gpushare-dra"]  # the base's two containers; no overlay names one


@needs_kubectl
def test_every_container_runs_the_image_the_kustomization_sets(rendered):
    for folder in (DEPLOY, MOCK):
        pod, _ = plugin_container(rendered[folder])
        assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {"gpushare-dra:dev"}


@needs_kubectl
def test_mock_overlay_switches_backend_and_keeps_the_rest(rendered):
    pod, plugin = plugin_container(rendered[MOCK])
    assert "--device-backend=mock" in plugin["args"] and "--hook-dir=/opt/gpushare/lib" in plugin["args"]
    assert "--with-sim" in pod["initContainers"][0]["args"]
    assert "affinity" not in pod and pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    env = {e["name"]: e for e in plugin["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void" and "NODE_NAME" in env  # merged, not replaced
    assert plugin["image"] == "gpushare-dra:dev" and plugin["volumeMounts"]
    # simulated GPUs load no driver: no --driver-root (refused with mock GPUs) and no host / mounted
    assert not [a for a in plugin["args"] if a.startswith("--driver-root")]
    assert "/driver-root" not in {m["mountPath"] for m in plugin["volumeMounts"]}
    assert "driver-root" not in {v["name"] for v in pod["volumes"]}
    # Everything but the DaemonSet is the base's, unchanged.
    others = [o for o in rendered[MOCK] if o["kind"] != "DaemonSet"]
    assert others == [o for o in rendered[DEPLOY] if o["kind"] != "DaemonSet"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", sorted((DEPLOY / "examples").rglob("*.yaml")), ids=lambda p: p.name)
def test_example_manifests_are_valid(path, version):
    for doc in docs(path):
        kubernetes_validate.validate(doc, version, strict=True)


@needs_kubectl
@pytest.mark.parametrize("folder", [DEPLOY, MOCK], ids=["deploy", "mock"])
def test_upgrade_surges_with_sockets_per_pod(rendered, folder):
    """The new pod serves beside the old one (tests/kubeletplugin/test_rolling_update.py)."""
    (ds,) = [o for o in rendered[folder] if o["kind"] == "DaemonSet"]
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    _, plugin = plugin_container(rendered[folder])
    env = {e["name"]: e for e in plugin["env"]}
    assert env["GPUSHARE_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"


@needs_kubectl
def test_the_init_container_is_not_privileged(rendered):
    """install-hook copies a file into a root-owned host folder: root, no capability, no way to
    gain one (the chart renders the same DaemonSet: tests/operators/test_helm.py)."""
    for folder in (DEPLOY, MOCK):
        pod, _ = plugin_container(rendered[folder])
        (init,) = pod["initContainers"]
        assert init["securityContext"] == {
            "runAsUser": 0, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}, folder


def documented_grants() -> dict[tuple[str, str, str], list[str]]:
    """docs/security.md's "Least privilege" table: (API group, resource, names) -> verbs."""
    text = (ROOT / "docs" / "security.md").read_text()
    table = text[text.index("| API group | resource | names | verbs |"):].split("\n\n")[0]
    grants = {}
    for row in table.splitlines()[2:]:
        group, resource, names, verbs = (c.strip().replace("`", "") for c in row.strip("|").split("|")[:4])
        grants[("" if group == "core" else group, resource, "" if names == "all" else names)] = verbs.split(", ")
    return grants


@needs_kubectl
def test_the_plugin_is_granted_exactly_what_docs_security_md_says(rendered):
    (role,) = [o for o in rendered[DEPLOY] if o["kind"] == "ClusterRole"]
    granted: dict[tuple[str, str, str], list[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for name in rule.get("resourceNames") or [""]:
                    granted.setdefault((group, resource, name), []).extend(rule["verbs"])
    assert granted == documented_grants()
    assert ("", "pods", "") in granted and granted["", "pods", ""] == ["get"]  # never list or watch
    # status.devices of gpushare.dev only, and only of claims on the plugin's own node
    assert granted["resource.k8s.io", "resourceclaims/driver", "gpushare.dev"] == ["associated-node:patch"]
    assert not any(r in ("resourceclaims/binding", "resourceclaims/driver") for _, r, name in granted
                   if name != "gpushare.dev")
