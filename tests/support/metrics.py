"""The plugin's metrics as Prometheus stores them, without a node: its collectors over a
stand-in agent (one claim on GPU 1), the labels a ServiceMonitor target adds, and a
dcgm-exporter series of the same GPU (tests/operators: labels, and PromQL through promtool)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kubeletplugin.agent.guard import Guard
from kubeletplugin.agent.metrics import AgentCollector
from kubeletplugin.agent.sampler import GpuSample
from kubeletplugin.agent.shares import Share
from kubeletplugin.health import HealthCollector, HealthMonitor
from kubeletplugin.prepared import PreparedGpu

UUID = "GPU-5ea1c0de-0000-4000-8000-000000000001"
# What prometheus-operator gives every target of a ServiceMonitor, plus the relabelled node.
TARGET = {"job": "gpushare-kubelet-plugin-metrics", "instance": "10.0.0.7:9466", "namespace": "gpushare-system",
          "pod": "gpushare-kubelet-plugin-x", "container": "plugin", "service": "gpushare-kubelet-plugin-metrics",
          "endpoint": "metrics", "node": "node-1"}
# A dcgm-exporter series as its docs show it (default labels, kubernetes mapping on).
DCGM = {"gpu": "1", "UUID": UUID, "device": "nvidia1", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-1",
        "DCGM_FI_DRIVER_VERSION": "580.65.06", "namespace": "team-a", "pod": "train-0", "container": "main"}


def agent() -> SimpleNamespace:
    gpu = PreparedGpu(1, UUID, 1, 4 * 2**30, 30)
    claim = SimpleNamespace(uid="u1", namespace="team-a", name="shared-gpu", gpus=[gpu], regions=[None],
                            shares=[Share(limit=0.3, burst=False)], process_memory=[{4242: 2**30}],
                            sharing_strategy="TimeSlicing")
    sample = GpuSample(uuid=UUID, index=1, memory_used=2**30, memory_total=80 * 2**30, utilization=40,
                       temperature=50, power_watts=300.0)
    backstop = SimpleNamespace(violations={}, kills={}, total_violations=0, total_kills=0, last_poll_s=0.001)
    return SimpleNamespace(lock=threading.Lock(), claims={"u1": claim}, gpus=[sample], backstop=backstop,
                           guard=Guard(), last_tick_s=0.01,
                           mps_watch=SimpleNamespace(restarts=lambda: {UUID: 2}, daemon_exits=lambda: {UUID: 1}))


def scrape() -> str:
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent()))  # type: ignore[arg-type]
    health = HealthMonitor()
    health.apply([SimpleNamespace(uuid=UUID, index=1, healthy=True)])  # type: ignore[list-item]
    health.record(UUID, 0x8, 79)  # XID 79 (nvmlEventTypeXidCriticalError)
    registry.register(HealthCollector(health))
    return generate_latest(registry).decode()


def series() -> list[tuple[str, dict[str, str]]]:
    return [(s.name, s.labels) for f in text_string_to_metric_families(scrape()) for s in f.samples]


def stored(labels: dict[str, str], endpoint: dict) -> dict[str, str]:
    if endpoint.get("honorLabels"):
        return {**TARGET, **labels}
    return {**TARGET, **{f"exported_{k}" if k in TARGET else k: v for k, v in labels.items()}}
