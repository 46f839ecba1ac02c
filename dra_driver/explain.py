"""`gpushare-dra explain CLAIM`: what each GPU of the cluster has free for a claim, and why it
does or does not fit. A claim that fits a GPU's size but no GPU's free capacity stays Pending
with the scheduler's generic "cannot allocate all claims"; this names the GPUs, their free
memory and compute, and what each request asks (docs/operations.md, "Why a claim is Pending").

Read from the API server only: the driver's ResourceSlices (each GPU's memory and compute, or its
partition shares, and the taints its devices carry) and every allocated ResourceClaim (what it
consumes of which device). Not judged: DeviceTaintRules (taints an admin puts on devices through
the API rather than in the slice) and CEL selectors (a class's or a request's).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from decimal import Decimal

from kubernetes import client

from .devicemodel import FULL_COMPUTE, MEMORY_STEP, parse_device_name
from .devicetaints import untolerated
from .kube import JSON, api_client, api_error, json_body
from .quantity import QuantityError, format_bytes, parse_bytes, parse_decimal

MEMORY_KEYS = ("memory", "gpushare.dev/memory")
COMPUTE_KEYS = ("compute", "gpushare.dev/compute")
REQUEST_TIMEOUT = (5, 30)


@dataclass
class Gpu:
    """One GPU of a node as its slice publishes it, and what allocated claims use of it."""

    node: str
    name: str  # gpu-<i>
    memory: int
    compute: Decimal
    default_memory: int
    used_memory: int = 0
    used_compute: Decimal = Decimal(0)
    whole: bool = False  # taken whole (a request with no capacity)
    shares: list[str] = field(default_factory=list)  # partition mode: its share devices
    taken: set[str] = field(default_factory=set)  # ... and those allocated
    taints: list[JSON] = field(default_factory=list)  # its devices' taints (the health monitor's)

    @property
    def partition(self) -> bool:
        return bool(self.shares)

    def free(self) -> str:
        if self.partition:
            return f"{len(self.shares) - len(self.taken)} of {len(self.shares)} shares free " \
                   f"(each memory {format_bytes(self.memory // len(self.shares))})"
        if self.whole:
            return f"memory {format_bytes(self.memory)}, compute {self.compute}: taken whole by a claim"
        return f"memory {format_bytes(self.memory - self.used_memory)} free of {format_bytes(self.memory)}, " \
               f"compute {self.compute - self.used_compute} free of {self.compute}"


def _quantity(capacity: JSON, keys: tuple[str, ...]) -> object | None:
    return next((capacity[k] for k in keys if k in capacity), None)


def gpus_of(slices: list[JSON], driver: str) -> dict[tuple[str, str], Gpu]:
    """(pool, gpu-<i>) -> Gpu, from the driver's slices."""
    gpus: dict[tuple[str, str], Gpu] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        pool = (spec.get("pool") or {}).get("name", "")
        node = spec.get("nodeName") or pool
        for device in spec.get("devices") or []:
            ref = parse_device_name(device.get("name"))
            capacity = device.get("capacity") or {}
            if ref is None or "memory" not in capacity:
                continue
            memory = parse_bytes(capacity["memory"]["value"], "memory")
            compute = parse_decimal(capacity.get("compute", {}).get("value", FULL_COMPUTE), "compute")
            key = (pool, f"gpu-{ref.gpu_index}")
            if ref.share is None:
                policy = capacity["memory"].get("requestPolicy") or {}
                default = parse_bytes(policy.get("default", format_bytes(memory // 8)), "memory default")
                gpu = gpus[key] = Gpu(node, key[1], memory, compute, default)
            else:
                gpu = gpus.setdefault(key, Gpu(node, key[1], 0, Decimal(0), 0))
                gpu.memory += memory
                gpu.compute += compute
                gpu.shares.append(device["name"])
            gpu.taints += [t for t in device.get("taints") or [] if t not in gpu.taints]
    return gpus


def account(gpus: dict[tuple[str, str], Gpu], claims: list[JSON], driver: str) -> None:
    """Adds what every allocated claim consumes to its GPUs."""
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            ref = parse_device_name(result.get("device"))
            if result.get("driver") != driver or ref is None:
                continue
            gpu = gpus.get((result.get("pool", ""), f"gpu-{ref.gpu_index}"))
            if gpu is None:
                continue
            if ref.share is not None:
                gpu.taken.add(result["device"])
                continue
            consumed = result.get("consumedCapacity")
            if not consumed:
                gpu.whole = True
                continue
            gpu.used_memory += parse_bytes(_quantity(consumed, MEMORY_KEYS) or 0, "consumedCapacity.memory")
            gpu.used_compute += parse_decimal(_quantity(consumed, COMPUTE_KEYS) or 0, "consumedCapacity.compute")


@dataclass(frozen=True)
class Ask:
    name: str  # request, or request/subrequest
    device_class: str
    memory: int | None  # None: the device's default
    compute: Decimal | None  # None: all of the GPU's time
    capacity: bool  # asks capacity at all (else a whole GPU, or shares by count)
    count: int
    tolerations: tuple[JSON, ...] = ()

    def describe(self) -> str:
        if not self.capacity:
            return f"{self.count} device(s) of class {self.device_class}"
        memory = format_bytes(self.memory) if self.memory is not None else "the default (1/8 of the GPU)"
        compute = str(self.compute) if self.compute is not None else "100 (the default: the whole GPU's time)"
        return f"memory {memory}, compute {compute}"

    def untolerated(self, gpu: Gpu) -> list[str]:
        """The GPU's taints that keep the scheduler off it for this request, as key=value:effect."""
        return [f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}"
                for t in untolerated(gpu.taints, self.tolerations)]

    def verdict(self, gpu: Gpu) -> str:
        tainted = self.untolerated(gpu)
        if tainted:
            return f"no: tainted {', '.join(tainted)} and the request does not tolerate it"
        if gpu.partition:
            if self.capacity:
                return "no: partition-mode shares; capacity asks need capacity-mode GPUs"
            free = len(gpu.shares) - len(gpu.taken)
            return "fits" if free >= self.count else f"no: {self.count} share(s) asked, {free} free"
        if not self.capacity:
            return "fits" if not gpu.whole and not gpu.used_memory and not gpu.used_compute else \
                "no: a whole GPU asked, and claims use this one"
        if gpu.whole:
            return "no: taken whole by a claim"
        memory = self.memory if self.memory is not None else gpu.default_memory
        memory = math.ceil(memory / MEMORY_STEP) * MEMORY_STEP  # the scheduler's rounding to the step
        compute = Decimal(math.ceil(self.compute)) if self.compute is not None else gpu.compute
        short = []
        if memory > gpu.memory - gpu.used_memory:
            short.append(f"memory {format_bytes(memory)} asked, {format_bytes(gpu.memory - gpu.used_memory)} free")
        if compute > gpu.compute - gpu.used_compute:
            short.append(f"compute {compute} asked, {gpu.compute - gpu.used_compute} free")
        if not short:
            return "fits"
        never = memory > gpu.memory or compute > gpu.compute
        return "no: " + "; ".join(short) + (" (more than the GPU has)" if never else "")


def asks_of(claim: JSON) -> list[Ask]:
    asks = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        options = [(request["name"], request["exactly"])] if "exactly" in request else \
            [(f"{request['name']}/{s['name']}", s) for s in request.get("firstAvailable") or []]
        for name, exact in options:
            capacity = (exact.get("capacity") or {}).get("requests") or {}
            memory, compute = _quantity(capacity, MEMORY_KEYS), _quantity(capacity, COMPUTE_KEYS)
            asks.append(Ask(name, exact.get("deviceClassName", ""),
                            parse_bytes(memory, "memory") if memory is not None else None,
                            parse_decimal(compute, "compute") if compute is not None else None,
                            bool(capacity), int(exact.get("count", 1)), tuple(exact.get("tolerations") or ())))
    return asks


def verdicts(claim: JSON, slices: list[JSON], claims: list[JSON],
             driver: str) -> list[tuple[Ask, list[tuple[Gpu, str]]]]:
    """Each request (or subrequest) of the unallocated `claim` with, for every GPU, whether it
    fits what the other claims leave free ("fits", or "no: why")."""
    gpus = gpus_of(slices, driver)
    uid = claim["metadata"].get("uid")
    account(gpus, [c for c in claims if c["metadata"].get("uid") != uid], driver)
    return [(ask, [(gpu, ask.verdict(gpu)) for _, gpu in sorted(gpus.items())]) for ask in asks_of(claim)]


def explain(claim: JSON, slices: list[JSON], claims: list[JSON], driver: str) -> list[str]:
    """The lines `explain` prints: the claim's state, then per request what it asks and, per GPU,
    what is free and whether it fits."""
    meta = claim["metadata"]
    title = f"ResourceClaim {meta.get('namespace', '')}/{meta['name']}"
    allocation = (claim.get("status") or {}).get("allocation")
    if allocation:
        got = ", ".join(f"{r.get('pool')}/{r.get('device')}" for r in
                        (allocation.get("devices") or {}).get("results") or [] if r.get("driver") == driver)
        return [f"{title}: allocated ({got or 'no device of ' + driver})"]
    lines = [f"{title}: not allocated; the GPUs of {driver} and what they have free now:"]
    found = verdicts(claim, slices, claims, driver)
    if not any(per_gpu for _, per_gpu in found):
        return lines + [f"  no ResourceSlice of {driver} publishes a GPU: is the kubelet plugin running?"]
    fitting = 0
    for ask, per_gpu in found:
        lines.append(f"request '{ask.name}' ({ask.device_class}): {ask.describe()}")
        for gpu, verdict in per_gpu:
            fitting += verdict == "fits"
            lines.append(f"  {gpu.node} {gpu.name}: {gpu.free()} -> {verdict}")
    if fitting:
        lines.append("a GPU fits now: the scheduler allocates the claim at its next attempt (a pod must use it)")
    else:
        lines.append("no GPU fits now: the claim waits until claims on a GPU are deleted, or a request asks less")
    return lines


def run(args: argparse.Namespace) -> int:
    api = api_client(args.kubeconfig)
    resource = client.ResourceV1Api(api)
    try:
        claim = json_body(resource.read_namespaced_resource_claim(
            args.claim, args.namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))
        slices = json_body(resource.list_resource_slice(
            _preload_content=False, _request_timeout=REQUEST_TIMEOUT)).get("items") or []
        claims = json_body(resource.list_resource_claim_for_all_namespaces(
            _preload_content=False, _request_timeout=REQUEST_TIMEOUT)).get("items") or []
    except client.ApiException as e:
        print(f"gpushare-dra explain: {api_error(e)}", file=sys.stderr)
        return 1
    try:
        print("\n".join(explain(claim, slices, claims, args.driver_name)))
    except (QuantityError, KeyError, ValueError) as e:
        print(f"gpushare-dra explain: cannot read the cluster's claims or slices: {e}", file=sys.stderr)
        return 1
    return 0
