"""The agent's Prometheus metrics: a collector that reads the regions and the agent's last NVML
sample at scrape time (registered in the plugin's one registry, kubeletplugin/metrics.py).

Labels join dcgm-exporter's series without relabelling: `gpu` is the GPU's index and `UUID` its
uuid, as dcgm-exporter names them. A claim's series name it `claim_namespace` and `claim`, which
no scrape target label has (the ServiceMonitor's `namespace`, `pod`, `container` are the plugin
pod's), so nothing is renamed `exported_*` and no `honorLabels` is needed.

Per claim and GPU (labels claim_namespace, claim, gpu, UUID): limits, memory used (the region's
accounting), NVML memory of its processes, measured utilization, pacing rate, paced time,
out-of-memory refusals, backstop violations and kills, and its processes by enforcement (the
library, or the backstop alone: docs/images.md). Per GPU: NVML memory, utilization,
temperature and power where NVML has them; MPS server restarts (abnormal exits, mpswatch.py)
and control daemon ends the plugin did not ask for.
Per node: prepared claims, the agent period, the backstop's violations and kills (totals that
outlive the claims) and its last poll's time.
Shares of the GPU are ratios 0..1 (`*_ratio`), by Prometheus convention.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from dra_driver.config import NONE

from .procmap import slot_key
from .regions import EMPTY, Slot

if TYPE_CHECKING:
    from .agent import Agent

CLAIM = ["claim_namespace", "claim", "gpu", "UUID"]
GPU = ["gpu", "UUID"]


def under_library(pids: set[int], slots: list[Slot]) -> int:
    """How many of these host pids hold one of the region's usage slots (the library is active in them)."""
    taken = {(s.pidns, s.pid, s.start_time) for s in slots}
    return sum(1 for pid in pids if slot_key(pid) in taken)


class AgentCollector:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        a = self.agent
        g = {name: GaugeMetricFamily(f"gpushare_claim_{name}", doc, labels=CLAIM) for name, doc in (
            ("memory_limit_bytes", "The claim's memory limit on the GPU"),
            ("memory_used_bytes", "Memory the claim's processes hold, as the library accounts it (usage region)"),
            ("memory_nvml_bytes", "Memory the claim's processes hold, as NVML reports it"),
            ("compute_limit_ratio", "The claim's compute share of the GPU (0..1)"),
            ("utilization_ratio", "Share of GPU time the claim's processes used in the last agent period (0..1)"),
            ("pace_rate_ratio", "Refill rate the agent set for the claim's pacing, as a share of the GPU (0..1)"),
        )}
        c = {name: CounterMetricFamily(f"gpushare_claim_{name}", doc, labels=CLAIM) for name, doc in (
            ("paced_seconds", "Time the claim's kernel launches waited to hold the compute share"),
            ("oom_refusals", "Allocations refused because the claim was at its memory limit"),
            ("backstop_violations", "Times the claim's processes held more memory than its limit (NVML)"),
            ("backstop_kills", "Processes of the claim killed by the backstop (--enforce=kill)"),
            ("compute_held_seconds", "Time the compute guard kept the claim's processes stopped: it was far "
                                     "over its compute share while a neighbour was short (docs/security.md)"),
        )}
        processes = GaugeMetricFamily(
            "gpushare_claim_processes", "The claim's processes holding GPU memory (NVML), by what holds them: "
            "enforcement=library (the claim's library took a usage slot: limit, pacing, memory queries) or "
            "enforcement=backstop (musl or static programs, private loaders: the node's memory backstop only). "
            "Informational: a tenant can write its usage region", labels=[*CLAIM, "enforcement"])
        strategy = GaugeMetricFamily("gpushare_claim_sharing_strategy", "1 for the claim's sharingStrategy "
                                     "(TimeSlicing, MPS, None: docs/strategies.md)", labels=[*CLAIM, "strategy"])
        with a.lock:
            claims = list(a.claims.values())
            gpus = list(a.gpus)
            for cl in claims:
                for i, gpu in enumerate(cl.gpus):
                    labels = [cl.namespace, cl.name, str(gpu.index), gpu.uuid]
                    region = cl.regions[i]
                    counters = region.counters() if region else EMPTY
                    share = cl.shares[i]
                    g["memory_limit_bytes"].add_metric(labels, gpu.memory_limit)
                    strategy.add_metric([*labels, cl.sharing_strategy], 1)
                    g["memory_used_bytes"].add_metric(labels, counters.used)
                    g["memory_nvml_bytes"].add_metric(labels, sum(cl.process_memory[i].values()))
                    g["compute_limit_ratio"].add_metric(labels, gpu.compute_limit / 100)
                    if gpu.mig is None:  # NVML measures no process on a MIG device (NOT_SUPPORTED): no false 0
                        g["utilization_ratio"].add_metric(labels, round(share.measured, 4))
                    if cl.sharing_strategy != NONE:  # nothing paces a None claim: no rate to show
                        g["pace_rate_ratio"].add_metric(labels, round(share.rate, 4) if share.rate
                                                        else gpu.compute_limit / 100)
                    c["paced_seconds"].add_metric(labels, counters.paced_ns / 1e9)
                    c["oom_refusals"].add_metric(labels, region.oom_refusals if region else 0)
                    c["backstop_violations"].add_metric(labels, a.backstop.violations.get((cl.uid, i), 0))
                    c["backstop_kills"].add_metric(labels, a.backstop.kills.get((cl.uid, i), 0))
                    guard = a.guard.claims.get((cl.uid, i))
                    c["compute_held_seconds"].add_metric(labels, round(guard.held_s, 3) if guard else 0.0)
                    holding = {pid for pid, used in cl.process_memory[i].items() if used > 0}
                    library = under_library(holding, region.slots() if region else [])
                    processes.add_metric([*labels, "library"], library)
                    processes.add_metric([*labels, "backstop"], len(holding) - library)
        yield from g.values()
        yield from c.values()
        yield processes
        yield strategy
        yield GaugeMetricFamily("gpushare_prepared_claims", "Claims prepared on this node", value=len(claims))
        yield GaugeMetricFamily("gpushare_agent_period_seconds", "Time the agent's last period took",
                                value=a.last_tick_s)
        yield CounterMetricFamily("gpushare_backstop_violations", "Times claims' processes on this node held more "
                                  "memory than the claim's limit (NVML)", value=a.backstop.total_violations)
        yield CounterMetricFamily("gpushare_backstop_kills", "Processes the backstop killed on this node "
                                  "(--enforce=kill: the offending containers)", value=a.backstop.total_kills)
        yield GaugeMetricFamily("gpushare_backstop_poll_seconds", "Time the backstop's last NVML poll took",
                                value=a.backstop.last_poll_s)
        per_gpu = {name: GaugeMetricFamily(f"gpushare_gpu_{name}", doc, labels=GPU) for name, doc in (
            ("memory_used_bytes", "GPU memory in use (NVML)"), ("memory_total_bytes", "GPU memory (NVML)"),
            ("utilization_ratio", "Share of time the GPU was busy in the last agent period (NVML, 0..1)"),
            ("temperature_celsius", "GPU temperature (NVML)"), ("power_watts", "GPU power draw (NVML)"),
        )}
        for s in gpus:
            if s.mig:  # a MIG device: a part of its GPU (its claims' metrics say what their processes hold)
                continue
            labels = [str(s.index), s.uuid]
            per_gpu["memory_used_bytes"].add_metric(labels, s.memory_used)
            per_gpu["memory_total_bytes"].add_metric(labels, s.memory_total)
            utilization = s.utilization / 100 if s.utilization is not None else None  # NVML says percent
            for name, value in (("utilization_ratio", utilization), ("temperature_celsius", s.temperature),
                                ("power_watts", s.power_watts)):
                if value is not None:
                    per_gpu[name].add_metric(labels, value)
        yield from per_gpu.values()
        restarts = CounterMetricFamily("gpushare_mps_server_restarts", "MPS servers of the GPU that exited abnormally "
                                       "(a client's fatal fault): every MPS claim on the GPU lost its processes' GPU "
                                       "contexts", labels=GPU)
        indexes = {s.uuid: str(s.index) for s in gpus}
        for uuid, count in sorted(a.mps_watch.restarts().items()):
            restarts.add_metric([indexes.get(uuid, ""), uuid], count)
        yield restarts
        exits = CounterMetricFamily("gpushare_mps_daemon_exits", "MPS control daemons of the GPU that ended without "
                                    "the plugin stopping them (a quit it did not send, a kill, a crash): the GPU's "
                                    "MPS claims lost their servers until the next Prepare starts one", labels=GPU)
        for uuid, count in sorted(a.mps_watch.daemon_exits().items()):
            exits.add_metric([indexes.get(uuid, ""), uuid], count)
        yield exits
