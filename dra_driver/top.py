"""`gpushare-dra top`: a node's claims in the terminal, from the plugin's metrics endpoint."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .flags import FromArgs

Samples = dict[str, dict[tuple[str, ...], Any]]  # see scrape(): numbers, and the sharing strategy's name

COLUMNS = ("NAMESPACE/CLAIM", "GPU", "SHARING", "MEM LIMIT", "MEM USED", "NVML MEM", "COMPUTE", "UTIL", "RATE",
           "PACED", "OOM", "LIBRARY")  # LIBRARY: processes on the GPU the library holds / all (the rest: backstop only)


def human_bytes(n: float) -> str:
    """Binary units with at most one decimal, none when whole: 0B, 512Mi, 1.5Gi, 80Gi."""
    for unit in ("B", "Ki", "Mi", "Gi", "Ti"):
        if abs(n) < 1024 or unit == "Ti":
            text = f"{n:.0f}" if unit == "B" else f"{n:.1f}".removesuffix(".0")
            return text + unit
        n /= 1024
    return str(n)


def scrape(url: str, timeout: float = 5.0) -> Samples:
    """metric sample name -> {(claim namespace, claim, GPU uuid) or (GPU uuid, GPU index) or (): value};
    a sample with an `enforcement` label goes under "<name>:<enforcement>"."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = _key(s.labels)
            name = f"{s.name}:{s.labels['enforcement']}" if "enforcement" in s.labels else s.name
            # gpushare_claim_sharing_strategy: its label is the value
            out.setdefault(name, {})[key] = s.labels["strategy"] if "strategy" in s.labels else s.value
    return out


def _key(labels: dict[str, str]) -> tuple[str, ...]:
    """A series' key: its labels are claim_namespace, claim, gpu (the index), UUID (docs/agent.md);
    an older plugin (a node not upgraded yet) names them namespace, claim, gpu (the uuid), index."""
    if "UUID" in labels:
        uuid, index = labels["UUID"], labels.get("gpu", "")
    else:
        uuid, index = labels.get("gpu", ""), labels.get("index", "")
    if "claim" in labels:
        return labels.get("claim_namespace", labels.get("namespace", "")), labels["claim"], uuid
    return (uuid, index) if uuid or index else ()


def frame(m: Samples) -> str:
    def get(name: str, key: tuple[str, ...]) -> float:
        return float(m.get(name, {}).get(key, 0.0))

    rows = []
    for key in sorted(m.get("gpushare_claim_memory_limit_bytes", {})):
        ns, claim, gpu = key
        library = get("gpushare_claim_processes:library", key)
        rows.append((f"{ns}/{claim}", gpu[-12:], m.get("gpushare_claim_sharing_strategy", {}).get(key, "-"),
                     human_bytes(get("gpushare_claim_memory_limit_bytes", key)),
                     human_bytes(get("gpushare_claim_memory_used_bytes", key)),
                     human_bytes(get("gpushare_claim_memory_nvml_bytes", key)),
                     f"{get('gpushare_claim_compute_limit_ratio', key):.0%}",
                     f"{get('gpushare_claim_utilization_ratio', key):.1%}",
                     f"{get('gpushare_claim_pace_rate_ratio', key):.1%}"
                     if key in m.get("gpushare_claim_pace_rate_ratio", {}) else "-",  # None: not paced
                     f"{get('gpushare_claim_paced_seconds_total', key):.1f}s",
                     f"{get('gpushare_claim_oom_refusals_total', key):.0f}",
                     f"{library:.0f}/{library + get('gpushare_claim_processes:backstop', key):.0f}"))
    widths = [max(len(str(r[i])) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in [COLUMNS, *rows]]
    gpus = []
    for key, used in sorted(m.get("gpushare_gpu_memory_used_bytes", {}).items()):
        total = get("gpushare_gpu_memory_total_bytes", key)
        util = m.get("gpushare_gpu_utilization_ratio", {}).get(key)
        gpus.append(f"GPU {key[1]} {key[0]}: memory {human_bytes(used)} / {human_bytes(total)}"
                    + (f", utilization {util:.0%}" if util is not None else ""))
    claims = int(m.get("gpushare_prepared_claims", {}).get((), len(rows)))
    return "\n".join([f"prepared claims: {claims}", *gpus, "", *lines]) + "\n"


@dataclass(frozen=True)
class TopConfig(FromArgs):
    """What `gpushare-dra top` is started with."""

    url: str = "http://127.0.0.1:9400/metrics"
    interval: float = 2.0
    once: bool = False


def run(args: argparse.Namespace) -> int:
    return run_top(TopConfig.from_args(args))


def run_top(config: TopConfig) -> int:
    while True:
        try:
            text = frame(scrape(config.url))
        except OSError as e:
            print(f"gpushare-dra top: cannot read {config.url}: {e}", file=sys.stderr)
            return 1
        if config.once:
            sys.stdout.write(text)
            return 0
        sys.stdout.write("\033[H\033[2J" + time.strftime("%H:%M:%S ") + config.url + "\n" + text)
        sys.stdout.flush()
        time.sleep(config.interval)
