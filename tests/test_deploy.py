"""deploy/: base and every overlay render with the real `kubectl kustomize`, and every
rendered object is valid Kubernetes."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.support.kubectl import Kubectl, needs_kubectl

ROOT = Path(__file__).parents[1]
DEPLOY = ROOT / "deploy"
VERSIONS = ["1.34", kubernetes_validate.utils.latest_version()]
# Every folder with a kustomization: each must render on its own.
# Every folder that renders on its own: a kustomize Component (deploy/components/) only
# renders from an overlay that includes it (tests/test_deploy_metrics.py does).
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


def plugin_container(objects: list[dict]) -> tuple[dict, dict]:
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


@needs_kubectl
def test_daemonset_has_what_the_plugin_needs(rendered):
    pod, plugin = plugin_container(rendered[DEPLOY])
    mounts = {m["mountPath"] for m in plugin["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi",
            "/var/lib/gpushare", "/opt/gpushare/lib"} <= mounts
    env = {e["name"]: e for e in plugin["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert plugin["livenessProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    assert pod["serviceAccountName"] == "gpushare-dra"
    assert pod["initContainers"][0]["args"][0] == "install-hook"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


@needs_kubectl
def test_mock_overlay_switches_backend_and_keeps_the_rest(rendered):
    pod, plugin = plugin_container(rendered[MOCK])
    assert "--device-backend=mock" in plugin["args"] and "--hook-dir=/opt/gpushare/lib" in plugin["args"]
    assert "--with-sim" in pod["initContainers"][0]["args"]
    assert "nvidia.com/gpu.present" not in pod["nodeSelector"]
    env = {e["name"]: e for e in plugin["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void" and "NODE_NAME" in env  # merged, not replaced
    assert plugin["image"] == "gpushare-dra:dev" and plugin["volumeMounts"]
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
