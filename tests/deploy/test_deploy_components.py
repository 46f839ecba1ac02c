"""deploy/components and the overlay settings an operator makes (namespace, image): each renders
with the real `kubectl kustomize` from an overlay beside the shipped deploy/, the way the
components' comments say to use them, and changes exactly what it is for."""

from __future__ import annotations

import copy
import shutil

import kubernetes_validate
import pytest
import yaml

from playground.emulator import ApiEmulator, admission
from tests.support.deploy import DEPLOY, VERSIONS, by_name, plugin_container
from tests.support.kubectl import Kubectl, needs_kubectl

COMPONENTS = DEPLOY / "components"
KUBELET_DIR = {"pluginDir": "/var/lib/k0s/kubelet/plugins/gpushare.dev",
               "registryDir": "/var/lib/k0s/kubelet/plugins_registry"}


@pytest.fixture(scope="module")
def render(tmp_path_factory):
    """render(components, **kustomization fields, files={name: objects}) -> objects: an operator's
    overlay beside a copy of deploy/ (its components referenced as ../deploy/components/NAME)."""
    root = tmp_path_factory.mktemp("deploy")
    shutil.copytree(DEPLOY, root / "deploy", ignore=shutil.ignore_patterns("overlays", "examples"))
    kubectl = Kubectl(root / "kubectl")
    count = 0

    def build(components=(), files=None, **fields) -> list[dict]:
        nonlocal count
        count += 1
        overlay = root / f"overlay-{count}"
        overlay.mkdir()
        for name, objects in (files or {}).items():
            (overlay / name).write_text(yaml.safe_dump_all(objects))
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "resources": ["../deploy", *(files or {})],
            "components": [f"../deploy/components/{c}" for c in components], **fields}))
        return kubectl.objects("kustomize", overlay)

    return build


@pytest.fixture(scope="module")
def plain(render):
    return render()


def changed(before: list[dict], after: list[dict]) -> tuple[list[dict], list[dict], list[tuple[dict, dict]]]:
    """(added, removed, [(old, new)] modified) objects, matched by kind and name."""
    key = {id(o): (o["kind"], o["metadata"]["name"]) for o in before + after}
    old, new = {key[id(o)]: o for o in before}, {key[id(o)]: o for o in after}
    return ([new[k] for k in new.keys() - old.keys()], [old[k] for k in old.keys() - new.keys()],
            [(old[k], new[k]) for k in old.keys() & new.keys() if old[k] != new[k]])


def only_the_daemonset_changed(plain: list[dict], objects: list[dict]) -> tuple[dict, dict]:
    """Asserts that a component changed the DaemonSet and nothing else (no object added, removed
    or modified besides it); the DaemonSet before and after, as daemonset() gives them."""
    added, removed, modified = changed(plain, objects)
    assert (added, removed, [old["kind"] for old, _ in modified]) == ([], [], ["DaemonSet"])
    return daemonset(plain), daemonset(objects)


def daemonset(objects: list[dict]) -> dict:
    """The DaemonSet, its volumes in name order (a strategic merge patch moves the ones it patches first)."""
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    ds = copy.deepcopy(ds)
    ds["spec"]["template"]["spec"]["volumes"].sort(key=lambda v: v["name"])
    return ds


@needs_kubectl
def test_gpu_operator_component_moves_only_the_driver_root(plain, render):
    objects = render(["gpu-operator"])
    before, after = only_the_daemonset_changed(plain, objects)
    volumes = by_name(before["spec"]["template"]["spec"]["volumes"])
    volumes["driver-root"]["hostPath"] = {"path": "/run/nvidia/driver", "type": "DirectoryOrCreate"}
    assert after == before  # nothing else: the mount (read-only, HostToContainer) and --driver-root stay
    pod, plugin = plugin_container(objects)
    assert "--driver-root=/driver-root" in plugin["args"]
    assert by_name(plugin["volumeMounts"])["driver-root"]["readOnly"] is True


@needs_kubectl
def test_network_policy_component_admits_only_prometheus_to_the_metrics_port(plain, render):
    objects = render(["network-policy"])
    added, removed, modified = changed(plain, objects)
    assert ([o["kind"] for o in added], removed, modified) == (["NetworkPolicy"], [], [])
    (policy,) = added
    ds = daemonset(objects)
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert policy["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    # one peer holding both selectors: Prometheus pods of the monitoring namespace, nobody else
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    _, plugin = plugin_container(objects)
    ports = by_name(plugin["ports"])
    assert rule["ports"] == [{"protocol": "TCP", "port": "metrics"}] and "metrics" in ports
    assert "healthz" not in {p["port"] for p in rule["ports"]}  # the kubelet's probes come from the node


@needs_kubectl
def test_node_restriction_is_in_the_base_with_its_binding(plain):
    """Each node's plugin writes only its own node's slices by default (no component to add)."""
    (policy,) = [o for o in plain if o["kind"] == "ValidatingAdmissionPolicy"
                 and o["metadata"]["name"] == "gpushare.dev-own-node-slices"]
    (binding,) = [o for o in plain if o["kind"] == "ValidatingAdmissionPolicyBinding"
                  and o["spec"]["policyName"] == policy["metadata"]["name"]]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    for expression in [v["expression"] for v in policy["spec"]["variables"] + policy["spec"]["validations"]]:
        assert admission.compile_error(expression) is None, expression


@needs_kubectl
def test_kubelet_dir_component_moves_every_place_of_each_folder(plain, render):
    settings = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "gpushare-kubelet-dir",
                             "annotations": {"config.kubernetes.io/local-config": "true"}},
                "data": KUBELET_DIR}
    objects = render(["kubelet-dir"], files={"kubelet-dir.yaml": [settings]})
    before, after = only_the_daemonset_changed(plain, objects)  # no ConfigMap
    pod = before["spec"]["template"]["spec"]
    (plugin,) = pod["containers"]
    for volume, variable, key in (("plugin-dir", "GPUSHARE_PLUGIN_DIR", "pluginDir"),
                                  ("registry-dir", "GPUSHARE_REGISTRY_DIR", "registryDir")):
        by_name(pod["volumes"])[volume]["hostPath"]["path"] = KUBELET_DIR[key]
        by_name(plugin["volumeMounts"])[volume]["mountPath"] = KUBELET_DIR[key]
        by_name(plugin["env"])[variable]["value"] = KUBELET_DIR[key]
    assert after == before


@needs_kubectl
def test_namespace_and_image_are_set_once_by_the_overlay(plain, render):
    objects = render(["servicemonitor", "network-policy"], namespace="gpu-sharing",
                     images=[{"name": "gpushare-dra", "newName": "registry.example.com/gpushare-dra",
                              "newTag": "v1.2.3"}])
    namespaced = [o for o in objects if o["kind"] in (
        "ServiceAccount", "DaemonSet", "Service", "ServiceMonitor", "NetworkPolicy")]
    assert len(namespaced) == 5 and {o["metadata"]["namespace"] for o in namespaced} == {"gpu-sharing"}
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"] == ["gpu-sharing"]
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpushare-dra", "namespace": "gpu-sharing"}]
    pod, _ = plugin_container(objects)
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {
        "registry.example.com/gpushare-dra:v1.2.3"}
    # kustomize also writes metadata.namespace into cluster-scoped kinds its schema does not know
    # (DeviceClass, admission policies; kubernetes-sigs/kustomize#6051); the API server drops it.
    # Nothing of gpushare-system is left anywhere else.
    for o in objects:
        o["metadata"].pop("namespace", None)
    assert "gpushare-system" not in yaml.safe_dump_all(objects)


@needs_kubectl
@pytest.mark.parametrize("version", VERSIONS)
def test_every_component_renders_valid_objects(render, version):
    settings = {"apiVersion": "v1", "kind": "ConfigMap", "data": KUBELET_DIR, "metadata": {
        "name": "gpushare-kubelet-dir", "annotations": {"config.kubernetes.io/local-config": "true"}}}
    components = sorted(p.name for p in COMPONENTS.iterdir() if (p / "kustomization.yaml").is_file())
    assert {"gpu-operator", "network-policy", "kubelet-dir", "node-label", "servicemonitor"} <= set(components)
    for o in render(components, files={"kubelet-dir.yaml": [settings]}):
        if o["kind"] != "ServiceMonitor":  # a CRD of prometheus-operator, not in Kubernetes' schemas
            kubernetes_validate.validate(o, version, strict=True)


# The node-restriction policy's CEL (deploy/base) as the API emulator evaluates it (as kube-apiserver does).
NODE_POLICY = next(d for d in yaml.safe_load_all((DEPLOY / "base" / "node-restriction.yaml").read_text())
                   if d["kind"] == "ValidatingAdmissionPolicy")
PLUGIN = "system:serviceaccount:gpushare-system:gpushare-dra"
NODE_EXTRA = "authentication.kubernetes.io/node-name"


def slice_of(node: str | None, driver: str = "gpushare.dev") -> dict:
    spec = {"driver": driver, "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}}
    spec.update({"nodeName": node} if node is not None else {"allNodes": True})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}, "spec": spec}


def write(operation: str, user: str, node: str | None, new: str | None = None, old: str | None = None,
          driver: tuple[str, str] = ("gpushare.dev", "gpushare.dev")):
    """None when the policy admits the write, else its message (the first refusing validation's);
    `driver`: the new and the stored slice's."""
    request = admission.request_attributes("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", operation,
                                           "", "s")
    request["userInfo"] = {"username": user, "groups": ["system:serviceaccounts"],
                           **({"extra": {NODE_EXTRA: [node]}} if node else {})}
    obj = slice_of(new, driver[0]) if operation != "DELETE" else None
    stored = slice_of(old, driver[1]) if operation != "CREATE" else None
    decisions = admission.validate(NODE_POLICY["spec"], admission.activation(NODE_POLICY["spec"], obj, stored, request))
    assert not any(d.error for d in decisions), decisions
    refused = [d for d in decisions if d.denied]
    assert all(d.reason == "Forbidden" for d in refused)
    return refused[0].message if refused else None


def test_a_plugin_writes_its_own_nodes_slices():
    assert write("CREATE", PLUGIN, "node-a", new="node-a") is None
    assert write("UPDATE", PLUGIN, "node-a", new="node-a", old="node-a") is None
    assert write("DELETE", PLUGIN, "node-a", old="node-a") is None
    # any namespace's gpushare-dra: an overlay's `namespace:` needs no edit of the policy
    assert write("CREATE", "system:serviceaccount:gpu-sharing:gpushare-dra", "node-a", new="node-a") is None


@pytest.mark.parametrize("operation, new, old, got", [
    ("CREATE", "node-b", None, "'node-b'"),
    ("CREATE", None, None, "no spec.nodeName"),
    ("UPDATE", "node-a", "node-b", "'node-b'"),  # taking over another node's slice
    ("UPDATE", "node-b", "node-a", "'node-b'"),  # handing its own slice to another node
    ("DELETE", None, "node-b", "'node-b'"),
])
def test_a_plugin_is_refused_other_nodes_slices(operation, new, old, got):
    assert write(operation, PLUGIN, "node-a", new=new, old=old) == (
        f"the gpushare plugin on node 'node-a' may only write ResourceSlices with spec.nodeName 'node-a' (got {got})")


@pytest.mark.parametrize("operation, drivers", [
    ("CREATE", ("nic.example.com", "")),
    ("UPDATE", ("gpushare.dev", "nic.example.com")),  # taking over another driver's slice
    ("UPDATE", ("nic.example.com", "gpushare.dev")),
    ("DELETE", ("", "nic.example.com")),
])
def test_a_plugin_is_refused_other_drivers_slices_on_its_own_node(operation, drivers):
    assert write(operation, PLUGIN, "node-a", new="node-a", old="node-a", driver=drivers) == (
        "the gpushare plugin may only write ResourceSlices with spec.driver 'gpushare.dev' (got 'nic.example.com')")


def test_a_plugin_token_without_a_node_is_refused():
    message = write("CREATE", PLUGIN, None, new="node-a")
    assert message is not None and message.startswith("the gpushare plugin's token names no node")


def test_other_users_are_not_restricted():
    for user in ("system:admin", "system:serviceaccount:gpushare-system:other", "system:node:node-a",
                 "system:serviceaccount:nvidia-dra:gpushare-dra-controller"):
        assert write("CREATE", user, None, new="node-b") is None, user
        assert write("DELETE", user, "node-a", old="node-b") is None, user


@needs_kubectl
def test_node_label_component_adds_only_its_label_to_the_node_selector(plain, render):
    objects = render(["node-label"])
    before, after = only_the_daemonset_changed(plain, objects)
    before["spec"]["template"]["spec"]["nodeSelector"] = {"gpushare.dev/node": "true"}
    assert after == before  # beside the GPU-node affinity: a GPU node, and labelled


@needs_kubectl
def test_an_overlay_with_its_own_namespace_applies(render, tmp_path):
    """What kustomize writes (a namespace on cluster-scoped kinds included) is what the API server
    takes: applied with kubectl to the API emulator, which drops the namespace of a cluster-scoped
    object as kube-apiserver does."""
    objects = render(namespace="gpu-sharing")
    with ApiEmulator() as emulator:
        kubectl = Kubectl(tmp_path, kubeconfig=emulator.write_kubeconfig(str(tmp_path / "kubeconfig")))
        kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
        assert kubectl("get", "daemonsets", "-n", "gpu-sharing", "-o", "name") == \
            "daemonset.apps/gpushare-kubelet-plugin\n"
        for kind in ("deviceclass", "validatingadmissionpolicy", "validatingadmissionpolicybinding"):
            stored = kubectl.objects("get", kind, "-o", "yaml")[0]["items"]
            assert stored and all("namespace" not in o["metadata"] for o in stored), kind
