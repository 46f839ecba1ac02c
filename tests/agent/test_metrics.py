"""Per-claim telemetry over HTTP, claim status through the emulator, `top --once`."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kubeletplugin.claimref import ClaimRef
from playground.claims import gpushare_config, opaque_config
from tests.support import MiB, wait_for


def test_metrics_match_what_the_claim_did(node):
    ref, ids = node.claim(memory="256Mi", compute=30)
    hog = node.run("hog", ids, "alloc", "--chunk", "64Mi", "--max", "1Gi", "--hold", "30")
    got = hog.read_until("allocated=", timeout=20)
    assert got["result"] == "oom" and int(got["allocated"]) == 256 * MiB
    # memory used (region) and NVML's view of the claim's processes
    assert wait_for(lambda: node.claim_metric("gpushare_claim_memory_used_bytes", ref) == 256 * MiB)
    assert wait_for(lambda: node.claim_metric("gpushare_claim_memory_nvml_bytes", ref) == 256 * MiB)
    assert node.claim_metric("gpushare_claim_oom_refusals_total", ref) == 1
    assert node.claim_metric("gpushare_claim_memory_limit_bytes", ref) == 256 * MiB
    assert node.claim_metric("gpushare_claim_compute_limit_ratio", ref) == 0.3
    # pacing: a launch loop at 30 % waits most of the time
    node.run("spin", ids, "launch", "--seconds", "1.5").wait(timeout=30)
    assert node.claim_metric("gpushare_claim_paced_seconds_total", ref) > 0.5
    # the hog's process took a usage slot: the library holds it, not the backstop alone
    assert wait_for(lambda: node.claim_metric("gpushare_claim_processes", ref) is not None)
    by = {dict(k)["enforcement"]: v for k, v in node.scrape()["gpushare_claim_processes"].items()}
    assert by == {"library": 1, "backstop": 0}, by
    m = node.scrape()
    assert m["gpushare_prepared_claims"][()] == 1
    assert not [name for name in m if name.endswith("_created")]  # Prometheus would store each as a series
    gpu0 = next(v for k, v in m["gpushare_gpu_memory_used_bytes"].items() if dict(k)["gpu"] == "0")
    assert gpu0 >= 256 * MiB
    assert any(v == 1 for k, v in m["gpushare_kubelet_plugin_claims_total"].items()
               if dict(k) == {"operation": "prepare", "result": "success"})


def test_errors_are_counted_by_reason(node):
    answer = node.kubelet.prepare(ClaimRef("default", "missing", "00000000-0000-0000-0000-000000000001"))
    assert answer.claims["00000000-0000-0000-0000-000000000001"].error
    m = node.scrape()
    assert m["gpushare_kubelet_plugin_errors_total"][(("operation", "prepare"), ("reason", "claim_not_found"))] == 1
    # the API client's view of the same call: a GET answered 404
    assert m["gpushare_api_requests_total"][(("code", "404"), ("verb", "GET"))] >= 1
    assert m["gpushare_api_request_duration_seconds_count"][(("verb", "GET"),)] >= 1


def test_build_process_and_api_metrics(node):
    node.claim()
    m = node.scrape()
    ((labels, value),) = m["gpushare_build_info"].items()
    assert value == 1 and dict(labels)["version"] and dict(labels)["python_version"]
    assert m["process_resident_memory_bytes"][()] > 1 << 20
    assert m["process_cpu_seconds_total"][()] > 0
    assert sum(v for k, v in m["gpushare_api_requests_total"].items() if dict(k)["code"].startswith("2")) >= 1


@pytest.mark.parametrize("path", ["/", "/healthz", "/metrics/", "/favicon.ico"])
def test_only_metrics_path_answers(node, path):
    url = node.url.removesuffix("/metrics") + path
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url, timeout=10)
    assert e.value.code == 404


def test_docs_list_every_metric_and_reason(node):
    """docs/agent.md names every family the endpoint serves and every error reason the code raises."""
    doc = (Path(__file__).parents[2] / "docs" / "agent.md").read_text()
    families = {f.name for f in node.plugin.metrics.registry.collect()}  # with or without samples yet
    ours = {n for n in families if n.startswith("gpushare_")}
    assert len(ours) >= 23 and "process_cpu_seconds" in families
    missing = [n for n in ours if not re.search(rf"`{n}(_total)?`", doc)]
    assert not missing, missing
    code = "".join(p.read_text() for p in (Path(__file__).parents[2] / "kubeletplugin").rglob("*.py"))
    reasons = (set(re.findall(r'reason(?:: str)? ?= ?"([a-z_]+)"', code))
               | set(re.findall(r'on_error\(\w+, "([a-z_]+)"\)', code))
               | set(re.findall(r'StrategyError\("[^"]*", "([a-z_]+)"', code)))  # kubeletplugin/strategies/
    assert {"invalid_claim", "internal", "claim_not_found"} <= reasons
    listed = re.search(r"reason[^:]*: ([a-z_, ]+)\)", doc).group(1)
    assert reasons == {r.strip() for r in listed.split(",")}


def test_claim_status_written_and_cleared(node):
    ref, _ = node.claim(memory="512Mi", compute=20)
    devices = wait_for(lambda: (node.read_claim(ref).get("status") or {}).get("devices"))
    assert len(devices) == 1
    d = devices[0]
    assert (d["driver"], d["pool"], d["device"]) == ("gpushare.dev", "node-a", "gpu-0")
    assert d["data"] == {"uuid": "GPU-5ea1c0de-0000-4000-8000-000000000000", "memoryLimit": str(512 * MiB),
                         "computeLimit": 20, "computePolicy": "Hard", "sharingStrategy": "TimeSlicing",
                         "priority": "Batch"}
    node.kubelet.unprepare(ref)
    wait_for(lambda: not (node.read_claim(ref).get("status") or {}).get("devices"))


def test_status_write_failure_does_not_fail_prepare(node, monkeypatch):
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise OSError("API server unreachable")

    monkeypatch.setattr(node.plugin.agent.status.resource_api, "patch_namespaced_resource_claim_status", refuse)
    monkeypatch.setattr("kubeletplugin.agent.status.RETRY_S", (0.2,))
    ref, _ = node.claim()  # asserts no error
    wait_for(lambda: len(calls) >= 2)  # retried
    monkeypatch.undo()
    wait_for(lambda: (node.read_claim(ref).get("status") or {}).get("devices"), timeout=15)


def test_top_once(node):
    ref, ids = node.claim(memory="256Mi", compute=40)
    node.run("hold", ids, "alloc", "--chunk", "128Mi", "--max", "128Mi", "--hold", "30").read_until("allocated=")
    wait_for(lambda: node.claim_metric("gpushare_claim_memory_nvml_bytes", ref) == 128 * MiB)
    out = subprocess.run([sys.executable, "-m", "dra_driver.cli", "top", "--once", "--url", node.url],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if ref.name in line)
    assert "256Mi" in row and "128Mi" in row and "40%" in row, out.stdout
    assert "prepared claims: 1" in out.stdout


def test_a_none_claim_shows_no_pacing_rate(node):
    """Nothing paces a sharingStrategy None claim: no rate metric, `-` in top's RATE column, where
    a TimeSlicing claim shows its share."""
    none, _ = node.claim(memory="256Mi", compute=25, config=[opaque_config(gpushare_config(sharingStrategy="None"))])
    sliced, _ = node.claim(memory="256Mi", compute=25)
    wait_for(lambda: node.claim_metric("gpushare_claim_pace_rate_ratio", sliced) == 0.25)
    assert node.claim_metric("gpushare_claim_pace_rate_ratio", none) is None
    assert node.claim_metric("gpushare_claim_compute_limit_ratio", none) == 0.25  # the scheduler still counts it
    out = subprocess.run([sys.executable, "-m", "dra_driver.cli", "top", "--once", "--url", node.url],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = next(line for line in lines if line.startswith("NAMESPACE/CLAIM"))
    rows = lines[lines.index(header) + 1:]
    rate = header.index("RATE")
    by_claim = {row.split()[0].split("/")[1]: row[rate:].split()[0] for row in rows if row.startswith("default/")}
    assert by_claim == {none.name: "-", sliced.name: "25.0%"}, out.stdout
