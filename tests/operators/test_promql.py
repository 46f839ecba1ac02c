"""The example queries of docs/agent.md are valid PromQL, and the plugin's series join
dcgm-exporter's as Prometheus stores them through the ServiceMonitor (no honorLabels: the target's
namespace/pod/container beside the series' own labels), without label_replace: evaluated by
Prometheus' own engine (`promtool test rules`), and by a real Prometheus scraping them (Debian's
prometheus package; each test skips, saying so, without it)."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import REPO
from tests.support.metrics import DCGM, TARGET, UUID, scrape, series, stored

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not on PATH (apt-get install prometheus)")
AGENT_DOC = REPO / "docs" / "agent.md"


def documented_queries() -> list[str]:
    """The `example query` column of docs/agent.md's metric tables, and the DCGM join below them."""
    queries = []
    for line in AGENT_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`gpushare_") and "`" in cells[3]:
            queries.append(re.search(r"`([^`]+)`", cells[3]).group(1))
    join = re.search(r"`(gpushare_claim_memory_nvml_bytes [^`]+DCGM_FI_DEV_FB_USED)`", AGENT_DOC.read_text())
    assert join, "docs/agent.md lost its DCGM join example"
    return [*queries, join.group(1)]


def promtool(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)


def series_text(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_every_documented_query_is_valid_promql(tmp_path):
    queries = documented_queries()
    assert len(queries) >= 20  # one per metric
    rules = {"groups": [{"name": "docs", "rules": [{"record": f"docs:query_{i}", "expr": q}
                                                      for i, q in enumerate(queries)]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    out = promtool(tmp_path, "check", "rules", "rules.yaml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_plugin_series_join_dcgm_series_as_stored(tmp_path):
    endpoint: dict = {}  # the ServiceMonitor's: no honorLabels
    inputs = [{"series": series_text(name, stored(labels, endpoint)), "values": f"{value!r}x3"}
              for name, labels, value in _samples()]
    dcgm_target = {**TARGET, "job": "nvidia-dcgm-exporter", "pod": "nvidia-dcgm-exporter-x",
                   "container": "nvidia-dcgm-exporter", "namespace": "gpu-operator"}
    dcgm = {**dcgm_target, **DCGM}  # dcgm-exporter is scraped with honorLabels: its pod labels win
    inputs += [{"series": series_text("DCGM_FI_DEV_GPU_UTIL", dcgm), "values": "42x3"},
               {"series": series_text("DCGM_FI_DEV_FB_USED", dcgm), "values": "2048x3"}]
    claim = stored({"claim_namespace": "team-a", "claim": "shared-gpu", "gpu": "1", "UUID": UUID}, endpoint)
    gpu = stored({"gpu": "1", "UUID": UUID}, endpoint)
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": inputs, "promql_expr_test": [
            # each claim's part of the memory DCGM sees in use: 1Gi of 2048MiB
            {"expr": "gpushare_claim_memory_nvml_bytes / 1024^2 / on(UUID) group_left DCGM_FI_DEV_FB_USED",
             "eval_time": "2m", "exp_samples": [{"labels": series_text("", claim), "value": 0.5}]},
            # the agent's utilization against dcgm-exporter's, joined on UUID
            {"expr": "gpushare_gpu_utilization_ratio * 100 - on(UUID) group_left DCGM_FI_DEV_GPU_UTIL",
             "eval_time": "2m", "exp_samples": [{"labels": series_text("", gpu), "value": -2}]},
            # and on (node, gpu): the index, as dcgm-exporter names it
            {"expr": "count(gpushare_gpu_memory_total_bytes * on(node, gpu) group_left DCGM_FI_DEV_FB_USED)",
             "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": 1}]},
        ]}]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    out = promtool(tmp_path, "test", "rules", "tests.yaml")
    assert out.returncode == 0, out.stdout + out.stderr


def _samples() -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of the stand-in's gauges and counters (the families Prometheus stores)."""

    from tests.support.metrics import scrape

    out = []
    for family in text_string_to_metric_families(scrape()):
        for s in family.samples:
            if not s.name.endswith("_created"):
                out.append((s.name, s.labels, s.value))
    assert {n for n, _, _ in out} >= {n for n, _ in series() if n.startswith("gpushare_gpu_")}
    return out


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not on PATH (apt-get install prometheus)")
def test_a_real_prometheus_scrapes_and_joins(tmp_path):
    """A real Prometheus scrapes the plugin's metrics and a dcgm-exporter stand-in, with the target
    labels the ServiceMonitors give (no honor_labels for the plugin, honor_labels for
    dcgm-exporter, as NVIDIA's ServiceMonitor has it), and answers the join on UUID."""
    dcgm_text = "".join(f"# TYPE {name} gauge\n{series_text(name, DCGM)} {value}\n"
                        for name, value in (("DCGM_FI_DEV_FB_USED", 2048), ("DCGM_FI_DEV_GPU_UTIL", 42)))
    pages = {"/plugin": scrape(), "/dcgm": dcgm_text}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            body = pages.get(self.path, "").encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    exporter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = f"127.0.0.1:{exporter.server_port}"
    plugin_labels = {k: v for k, v in TARGET.items() if k not in ("job", "instance")}
    dcgm_labels = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x", "container": "nvidia-dcgm-exporter",
                   "node": TARGET["node"]}
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "gpushare", "metrics_path": "/plugin", "honor_labels": False,
         "static_configs": [{"targets": [target], "labels": plugin_labels}]},
        {"job_name": "dcgm", "metrics_path": "/dcgm", "honor_labels": True,
         "static_configs": [{"targets": [target], "labels": dcgm_labels}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    server = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def query(expr: str) -> list[dict]:
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.load(answer)["data"]["result"]

    try:
        join = "gpushare_claim_memory_nvml_bytes / 1024^2 / on(UUID) group_left DCGM_FI_DEV_FB_USED"
        deadline, result = time.monotonic() + 60, []
        while time.monotonic() < deadline and not result:
            time.sleep(0.5)
            try:
                result = query(join)
            except OSError:
                continue
        assert result, server.stderr.read() if server.poll() is not None else "no join within 60 s"
        [sample] = result
        assert float(sample["value"][1]) == 0.5
        labels = sample["metric"]
        assert (labels["claim_namespace"], labels["claim"], labels["gpu"], labels["UUID"]) == (
            "team-a", "shared-gpu", "1", UUID)
        assert labels["namespace"] == "gpushare-system" and labels["pod"] == TARGET["pod"]
        everything = query('{job="gpushare"}')
        assert everything and not [k for s in everything for k in s["metric"] if k.startswith("exported_")]
    finally:
        server.terminate()
        server.wait(timeout=30)
        exporter.shutdown()
