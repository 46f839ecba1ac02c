"""What deploy/ ships for scraping: the plugin's metrics port, its Service, scrape annotations
and the opt-in ServiceMonitor component agree with each other and with the flag."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dra_driver.cli import build_parser, env_name

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
DCGM_EXPORTER_PORT = 9400

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not on PATH")


def kustomize(path: Path) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(objects: list[dict], kind: str) -> dict:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj


def metrics_port(args: list[str]) -> int:
    (addr,) = [a.split("=", 1)[1] for a in args if a.startswith("--metrics-addr=")]
    return int(addr.rpartition(":")[2])


@needs_kubectl
def test_metrics_port_service_and_annotations_agree():
    objects = kustomize(DEPLOY)
    ds, svc = one(objects, "DaemonSet"), one(objects, "Service")
    template = ds["spec"]["template"]
    (plugin,) = template["spec"]["containers"]
    port = metrics_port(plugin["args"])
    assert port != DCGM_EXPORTER_PORT
    assert {"name": "metrics", "containerPort": port} in plugin["ports"]
    notes = template["metadata"]["annotations"]
    assert notes == {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}
    # the Service reaches every plugin pod by the named port, and only them
    assert svc["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    assert svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]
    assert "annotations" not in svc["metadata"]  # the pods carry them: one scrape per pod, not two
    for o in objects:
        kubernetes_validate.validate(o, "1.34", strict=True)


def test_mock_overlay_keeps_the_metrics_port():
    """The overlay's args replace the base's list: it must repeat the port."""
    base = yaml.safe_load_all((DEPLOY / "base" / "kubelet-plugin.yaml").read_text())
    (ds,) = [d for d in base if d and d["kind"] == "DaemonSet"]
    mock = yaml.safe_load((DEPLOY / "overlays" / "mock" / "mock-plugin.yaml").read_text())
    ports = [metrics_port(d["spec"]["template"]["spec"]["containers"][0]["args"]) for d in (ds, mock)]
    assert ports[0] == ports[1]


@needs_kubectl
def test_servicemonitor_component_selects_the_service(tmp_path):
    """Used the way its comment says: from an operator's own overlay beside the base."""
    shutil.copytree(DEPLOY, tmp_path / "deploy", ignore=shutil.ignore_patterns("overlays"))
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["../deploy"], "components": ["../deploy/components/servicemonitor"]}))
    objects = kustomize(overlay)
    svc, sm = one(objects, "Service"), one(objects, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # no namespaceSelector: prometheus-operator looks in the ServiceMonitor's own namespace
    assert "namespaceSelector" not in sm["spec"] and sm["metadata"]["namespace"] == svc["metadata"]["namespace"]
    assert [e["port"] for e in sm["spec"]["endpoints"]] == [p["name"] for p in svc["spec"]["ports"]]
    assert "ServiceMonitor" not in {o["kind"] for o in kustomize(DEPLOY)}  # opt-in only
    # the labels of a claim's series as Prometheus stores them through this ServiceMonitor: the
    # claim's own beside the plugin pod's, none renamed exported_*
    claim_series = {"claim_namespace": "team-a", "claim": "shared-gpu", "gpu": "0", "UUID": "GPU-0"}
    for endpoint in sm["spec"]["endpoints"]:
        stored = stored_labels(claim_series, endpoint)
        assert stored.items() >= claim_series.items() and stored["namespace"] == "gpushare-system", stored
        assert not [name for name in stored if name.startswith("exported_")], stored


# Labels the Prometheus Operator gives every target of a ServiceMonitor (its generated scrape
# config); a scraped label of the same name is renamed exported_<name> unless honorLabels is true
# (Prometheus' honor_labels).
TARGET_LABELS = {"job": "gpushare", "instance": "10.0.0.1:9400", "namespace": "gpushare-system",
                 "pod": "gpushare-kubelet-plugin-x", "service": "gpushare", "endpoint": "metrics",
                 "container": "plugin"}


def stored_labels(scraped: dict[str, str], endpoint: dict) -> dict[str, str]:
    targets = dict(TARGET_LABELS)
    targets.update({r["targetLabel"]: "node-1" for r in endpoint.get("relabelings", []) if "targetLabel" in r})
    if endpoint.get("honorLabels"):
        return {**targets, **scraped}
    out = dict(targets)
    for name, value in scraped.items():
        out[f"exported_{name}" if name in targets else name] = value
    return out


def test_stored_labels_model_renames_without_honor_labels():
    assert stored_labels({"namespace": "team-a"}, {})["exported_namespace"] == "team-a"


def test_every_plugin_env_var_is_read():
    """An env var the DaemonSet sets is read by the code, is a kubelet-plugin flag's variable
    (GPUSHARE_<FLAG>), or is the NVIDIA toolkit's."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / "base" / "kubelet-plugin.yaml").read_text()) if d]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    names = {e["name"] for c in ds["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])}
    code = "".join(p.read_text() for d in ("dra_driver", "kubeletplugin") for p in (ROOT / d).rglob("*.py"))
    plugin = build_parser()._subparsers._group_actions[0].choices["kubelet-plugin"]
    flag_variables = {env_name(o) for a in plugin._actions for o in a.option_strings if o.startswith("--")}
    unread = [n for n in names if not n.startswith("NVIDIA_") and n not in flag_variables
              and not re.search(rf"['\"]\${{?{n}|['\"]{n}['\"]", code)]
    assert not unread, unread
    assert {"GPUSHARE_PLUGIN_DIR", "GPUSHARE_REGISTRY_DIR"} <= flag_variables
