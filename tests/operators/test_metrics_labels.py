"""The plugin's series join dcgm-exporter's: `gpu` is the GPU's index and `UUID` its uuid, the
names dcgm-exporter gives them, and a claim's series name it `claim_namespace` and `claim`, so
through the shipped ServiceMonitor (no honorLabels) no label is renamed `exported_*` and the
target's `namespace`/`pod`/`container` are the plugin pod's, as on every other series.

The collectors are read here over a stand-in agent (tests/agent/test_metrics.py reads them on a
running node); the ServiceMonitor's effect is Prometheus' rule for target labels (a scraped
label of a target label's name is renamed exported_<name> unless honor_labels)."""

from __future__ import annotations

import yaml

from dra_driver import top
from tests.support.deploy import DEPLOY
from tests.support.metrics import DCGM, TARGET, UUID, scrape, series, stored


def test_gpu_series_carry_dcgm_exporters_gpu_and_uuid():
    per_gpu = {name: labels for name, labels in series() if name.startswith(("gpushare_gpu_", "gpushare_mps_"))}
    assert {"gpushare_gpu_memory_used_bytes", "gpushare_gpu_unhealthy", "gpushare_mps_server_restarts_total"} <= \
        per_gpu.keys()
    for name, labels in per_gpu.items():
        assert (labels["gpu"], labels["UUID"]) == ("1", UUID), name
        assert "index" not in labels


def test_claim_series_name_the_claim_apart_from_the_target():
    claims = [(n, labels) for n, labels in series() if n.startswith("gpushare_claim_")]
    assert claims
    for name, labels in claims:
        assert labels.items() >= {"claim_namespace": "team-a", "claim": "shared-gpu", "gpu": "1", "UUID": UUID}.items()
        assert "namespace" not in labels, name


def test_through_the_servicemonitor_nothing_is_renamed_and_everything_joins_dcgm():
    [monitor] = yaml.safe_load_all((DEPLOY / "components" / "servicemonitor" / "servicemonitor.yaml").read_text())
    [endpoint] = monitor["spec"]["endpoints"]
    assert not endpoint.get("honorLabels")
    for name, labels in series():
        kept = stored(labels, endpoint)
        assert not [k for k in kept if k.startswith("exported_")], (name, kept)
        assert kept["namespace"] == "gpushare-system" and kept["pod"] == TARGET["pod"]  # the pod that exports it
        if "UUID" in labels:  # joins DCGM_FI_* on(UUID) and on(node, gpu), no label_replace
            assert kept["UUID"] == DCGM["UUID"] and kept["gpu"] == DCGM["gpu"], name


def test_top_reads_the_new_labels(monkeypatch):
    class Answer:
        def __init__(self, text):
            self.text = text

        def read(self):
            return self.text.encode()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(top.urllib.request, "urlopen", lambda url, timeout: Answer(scrape()))
    m = top.scrape("http://x/metrics")
    assert m["gpushare_claim_memory_limit_bytes"] == {("team-a", "shared-gpu", UUID): 4 * 2**30}
    assert m["gpushare_gpu_memory_total_bytes"] == {(UUID, "1"): 80 * 2**30}
    frame = top.frame(m)
    assert "team-a/shared-gpu" in frame and f"GPU 1 {UUID}: memory 1Gi / 80Gi, utilization 40%" in frame
