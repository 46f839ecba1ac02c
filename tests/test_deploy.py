"""deploy/: every manifest, and the DaemonSet as each overlay renders it, is valid Kubernetes."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dra_driver.emulator.patch import strategic_merge_patch

ROOT = Path(__file__).parents[1]
DEPLOY = ROOT / "deploy"
VERSIONS = ["1.34", kubernetes_validate.utils.latest_version()]


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(overlay: Path) -> list[dict]:
    """What `kubectl apply -k` sends: resources, with strategic-merge patches applied by kind and name."""
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    objects: list[dict] = []
    for resource in kustomization.get("resources", []):
        target = (overlay / resource).resolve()
        objects += render(target) if target.is_dir() else docs(target)
    for patch in kustomization.get("patches", []):
        (p,) = docs(overlay / patch["path"])
        matches = [o for o in objects if (o["kind"], o["metadata"]["name"]) == (p["kind"], p["metadata"]["name"])]
        assert matches, f"{overlay}: patch {patch['path']} matches no resource"
        for o in matches:
            objects[objects.index(o)] = strategic_merge_patch(o, p)
    return objects


OVERLAYS = [DEPLOY, DEPLOY / "overlays" / "mock"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: str(p.relative_to(ROOT)))
def test_rendered_overlays_are_valid(overlay, version):
    objects = render(overlay)
    assert {"DaemonSet", "DeviceClass", "ClusterRole", "ServiceAccount", "Namespace"} <= {o["kind"] for o in objects}
    for o in objects:
        kubernetes_validate.validate(o, version, strict=True)


def plugin_container(overlay: Path) -> tuple[dict, dict]:
    (ds,) = [o for o in render(overlay) if o["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def test_daemonset_has_what_the_plugin_needs():
    pod, plugin = plugin_container(DEPLOY)
    mounts = {m["mountPath"] for m in plugin["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi",
            "/var/lib/gpushare", "/opt/gpushare/lib"} <= mounts
    env = {e["name"]: e for e in plugin["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert plugin["livenessProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    assert pod["serviceAccountName"] == "gpushare-dra"
    assert pod["initContainers"][0]["args"][0] == "install-hook"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_mock_overlay_switches_backend_and_keeps_the_rest():
    pod, plugin = plugin_container(DEPLOY / "overlays" / "mock")
    assert "--device-backend=mock" in plugin["args"] and "--hook-dir=/opt/gpushare/lib" in plugin["args"]
    assert "--with-sim" in pod["initContainers"][0]["args"]
    assert "nvidia.com/gpu.present" not in pod["nodeSelector"]
    env = {e["name"]: e for e in plugin["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void" and "NODE_NAME" in env  # merged, not replaced
    assert plugin["image"] == "gpushare-dra:dev" and plugin["volumeMounts"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", sorted((DEPLOY / "examples" / "e2e").glob("*.yaml")), ids=lambda p: p.name)
def test_kind_scenario_manifests_are_valid(path, version):
    for doc in docs(path):
        kubernetes_validate.validate(doc, version, strict=True)
