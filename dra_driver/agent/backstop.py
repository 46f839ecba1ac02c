"""Backstop: NVML's real per-process memory against each claim's limit.

The library keeps a claim within its limit only for allocations it sees. A static binary, an
API it does not hook, or a tampered region escapes it, but NVML still counts the memory. A
claim whose processes hold more than limit + tolerance on a GPU gets one Warning Event on its
ResourceClaim per episode, a counter, and under `--enforce=kill` its largest processes on that
GPU are killed (SIGKILL) until the rest fits.
"""

from __future__ import annotations

import datetime
import os
import signal
import uuid

from kubernetes import client

from dra_driver.log import get_logger

log = get_logger("agent.backstop")

REASON = "GpuMemoryLimitExceeded"
# NVML counts each process's CUDA context, which the library does not: allow that much per
# process on real GPUs (none on the simulator), plus a share of the limit for rounding.
CONTEXT_BYTES = {"nvml": 512 << 20, "mock": 0}
TOLERANCE_FRACTION = 0.05
TOLERANCE_MIN = 16 << 20


def tolerance(limit: int, processes: int, backend: str) -> int:
    return max(TOLERANCE_MIN, int(limit * TOLERANCE_FRACTION)) + processes * CONTEXT_BYTES.get(backend, 0)


class Backstop:
    def __init__(self, api: client.ApiClient, node: str, enforce: str, backend: str):
        self.core = client.CoreV1Api(api)
        self.node = node
        self.enforce = enforce
        self.backend = backend
        self._over: set[tuple[str, int]] = set()  # (uid, gpu) currently over: one Event per episode
        self.violations: dict[tuple[str, int], int] = {}
        self.kills: dict[tuple[str, int], int] = {}

    def check(self, claim, i: int, limit: int, region_used: int, process_memory: dict[int, int]) -> None:
        """One (claim, GPU): process_memory = this claim's host pids on the GPU -> NVML bytes."""
        key = (claim.uid, i)
        held = sum(process_memory.values())
        if held <= limit + tolerance(limit, len(process_memory), self.backend):
            self._over.discard(key)
            return
        if key in self._over:
            return
        self._over.add(key)
        self.violations[key] = self.violations.get(key, 0) + 1
        message = (f"processes of the claim hold {held} bytes on GPU {claim.gpus[i]['uuid']} (NVML), above the "
                   f"limit {limit}; the library accounted {region_used} (memory allocated around it)")
        log.warning("claim above its memory limit", claim=f"{claim.namespace}/{claim.name}", uid=claim.uid,
                    gpu=claim.gpus[i]["uuid"], held=held, limit=limit, accounted=region_used,
                    pids=sorted(process_memory), enforce=self.enforce)
        if self.enforce == "kill":
            killed = self._kill(claim, i, limit, process_memory)
            message += f"; killed pid(s) {', '.join(map(str, killed))}"
        self._event(claim, message)

    def _kill(self, claim, i: int, limit: int, process_memory: dict[int, int]) -> list[int]:
        killed = []
        left = sum(process_memory.values())
        for pid, used in sorted(process_memory.items(), key=lambda kv: -kv[1]):
            if left <= limit:
                break
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            killed.append(pid)
            left -= used
            key = (claim.uid, i)
            self.kills[key] = self.kills.get(key, 0) + 1
            log.warning("killed a process above its claim's memory limit (--enforce=kill)", pid=pid, bytes=used,
                        claim=f"{claim.namespace}/{claim.name}", uid=claim.uid, gpu=claim.gpus[i]["uuid"])
        return killed

    def _event(self, claim, message: str) -> None:
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{claim.name}.{uuid.uuid4().hex[:16]}", "namespace": claim.namespace},
                "involvedObject": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                   "name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
                "reason": REASON, "message": message, "type": "Warning", "count": 1,
                "firstTimestamp": now, "lastTimestamp": now,
                "source": {"component": "gpushare-dra-agent", "host": self.node},
                "reportingComponent": "gpushare.dev/agent", "reportingInstance": self.node}
        try:
            self.core.create_namespaced_event(claim.namespace, body)
        except Exception as e:  # the metric and the log line still tell
            log.error("cannot create the Event", claim=f"{claim.namespace}/{claim.name}", error=str(e))
