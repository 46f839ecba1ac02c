"""The devices a node offers, read from ResourceSlice dicts, and what one allocation costs.

Everything here works on plain camelCase dicts as the API server returns them
(resource.k8s.io/v1). Names are qualified the way the scheduler does it: an unqualified
attribute or capacity name belongs to the domain of the driver that published it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from dra_driver.devicetaints import untolerated
from dra_driver.quantity import QuantityError, format_bytes, parse_decimal, show

_BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


class Unfit(Exception):
    """This device cannot serve this request; the message says why (for error reports)."""


def qualify(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def to_quantity(value: object) -> Decimal:
    try:
        return parse_decimal(value if isinstance(value, int) else str(value), "quantity")
    except QuantityError as e:
        raise Unfit(f"invalid quantity {show(value)}: {e.problem}") from None


def format_quantity(amount: Decimal, like: object) -> str:
    """Write `amount` in the style of the device's own quantity `like` (binary suffix or plain)."""
    if amount == amount.to_integral_value():
        n = int(amount)
        return format_bytes(n) if str(like).endswith(_BINARY_SUFFIXES) else str(n)
    milli = amount * 1000
    return f"{int(milli)}m" if milli == milli.to_integral_value() else str(amount)


@dataclass
class Capacity:
    key: str  # as written in the slice; consumedCapacity uses this name
    value: Decimal
    text: object  # the slice's own quantity, for formatting results alike
    policy: dict  # requestPolicy, {} when absent


@dataclass
class Device:
    driver: str
    pool: str
    name: str
    attributes: dict[str, tuple[str, object]]  # qualified name -> (type, value), e.g. ("int", 0)
    capacity: dict[str, Capacity]  # qualified name -> capacity
    multi: bool  # allowMultipleAllocations
    taints: list[dict]
    cel_input: object = field(default=None, repr=False)  # built once by the CEL module
    # partitionable devices (KEP 4815): (counter set, counter) -> what allocating it takes of its pool's counters
    consumes: dict[tuple[str, str], Decimal] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)

    @classmethod
    def from_slice(cls, spec: dict, device: dict) -> Device:
        driver = spec["driver"]
        attributes = {}
        for name, typed in (device.get("attributes") or {}).items():
            kind, value = next(iter(typed.items()))  # exactly one of int/bool/string/version
            attributes[qualify(name, driver)] = (kind, value)
        capacity = {
            qualify(name, driver): Capacity(name, to_quantity(c["value"]), c["value"], c.get("requestPolicy") or {})
            for name, c in (device.get("capacity") or {}).items()
        }
        consumes = {(c["counterSet"], name): to_quantity(v["value"])
                    for c in device.get("consumesCounters") or [] for name, v in (c.get("counters") or {}).items()}
        return cls(driver, spec["pool"]["name"], device["name"], attributes, capacity,
                   bool(device.get("allowMultipleAllocations")), device.get("taints") or [], consumes=consumes)


@dataclass
class NodePools:
    """What a node offers: the usable devices in the order the scheduler tries them, and the
    pools it cannot use (by (driver, pool)): incomplete ones (fewer slices of the newest generation
    than pool.resourceSliceCount: the driver is still publishing) and invalid ones (a device name
    twice), each with why."""

    devices: list[Device]
    incomplete: set[tuple[str, str]]
    invalid: dict[tuple[str, str], str]


def node_devices(slices: list[dict], node_name: str) -> NodePools:
    """The node's devices in the order the scheduler tries them, from each pool's newest
    generation only: pools by driver then pool name, a pool's slices by name, each slice's
    devices in their order (k8s.io/dynamic-resource-allocation/structured, 1.36: kubernetes
    PR 136641 sorts slices and pools; before it the order was the informer's).

    As upstream's GatherPools and allocator (1.37): nothing is allocated from an incomplete or an
    invalid pool; a request for all devices fails while the node has one (NodePools says which).
    """
    ordered = sorted(slices, key=lambda s: (s["spec"]["driver"], s["spec"]["pool"]["name"],
                                            (s.get("metadata") or {}).get("name") or ""))
    local = [s["spec"] for s in ordered
             if s["spec"].get("nodeName") == node_name or s["spec"]["pool"]["name"] == node_name]
    newest: dict[tuple[str, str], int] = {}
    for spec in local:
        pool = (spec["driver"], spec["pool"]["name"])
        newest[pool] = max(newest.get(pool, 0), int(spec["pool"].get("generation", 0)))
    # Slices of an older generation are stale: the driver is replacing them.
    current = [s for s in local if int(s["pool"].get("generation", 0)) == newest[(s["driver"], s["pool"]["name"])]]
    seen = Counter((s["driver"], s["pool"]["name"]) for s in current)
    expected = {(s["driver"], s["pool"]["name"]): int(s["pool"].get("resourceSliceCount", 1)) for s in current}
    incomplete = {pool for pool, n in seen.items() if n != expected[pool]}
    invalid: dict[tuple[str, str], str] = {}
    names: dict[tuple[str, str], set[str]] = {}
    for spec in current:
        pool = (spec["driver"], spec["pool"]["name"])
        for d in spec.get("devices") or []:
            if d["name"] in names.setdefault(pool, set()):
                invalid.setdefault(pool, f"duplicate device name {d['name']}")
            names[pool].add(d["name"])
    devices = [Device.from_slice(spec, d) for spec in current for d in spec.get("devices") or []
               if (spec["driver"], spec["pool"]["name"]) not in incomplete | set(invalid)]
    return NodePools(devices, incomplete, invalid)


def node_counters(slices: list[dict], node_name: str) -> dict[tuple[str, str, str, str], Decimal]:
    """The node's shared counters (KEP 4815), newest generation of each pool:
    (driver, pool, counter set, counter) -> its value."""
    local = [s["spec"] for s in slices if s["spec"].get("nodeName") == node_name]
    newest: dict[tuple[str, str], int] = {}
    for spec in local:
        pool = (spec["driver"], spec["pool"]["name"])
        newest[pool] = max(newest.get(pool, 0), int(spec["pool"].get("generation", 0)))
    current = [s for s in local if int(s["pool"].get("generation", 0)) == newest[(s["driver"], s["pool"]["name"])]]
    return {(spec["driver"], spec["pool"]["name"], counter_set["name"], name): to_quantity(c["value"])
            for spec in current for counter_set in spec.get("sharedCounters") or []
            for name, c in (counter_set.get("counters") or {}).items()}


def untolerated_taint(device: Device, tolerations: list[dict]) -> dict | None:
    """The first NoSchedule/NoExecute taint of the device that no toleration covers."""
    return next(iter(untolerated(device.taints, tolerations)), None)


def consumed_amount(capacity: Capacity, requested: Decimal | None) -> Decimal:
    """What one allocation takes of `capacity`, after the device's requestPolicy.

    Not requested: the policy's default, else the whole capacity. validValues: the smallest
    valid value >= the request. validRange: at least min, rounded up to min + n*step, at
    most max. Raises Unfit when the policy cannot serve the request.
    """
    policy = capacity.policy
    if requested is None:
        if "default" not in policy:
            return capacity.value
        requested = to_quantity(policy["default"])
    if policy.get("validValues"):
        fitting = [v for v in map(to_quantity, policy["validValues"]) if v >= requested]
        if not fitting:
            raise Unfit(f"{capacity.key} {_show(requested, capacity)} is above every valid value of the device")
        return min(fitting)
    valid_range = policy.get("validRange")
    if not valid_range:
        return requested
    low = to_quantity(valid_range["min"])
    amount = max(requested, low)
    if valid_range.get("step"):
        step = to_quantity(valid_range["step"])
        amount = low + math.ceil((amount - low) / step) * step
    if valid_range.get("max") is not None and amount > to_quantity(valid_range["max"]):
        raise Unfit(f"{capacity.key} {_show(requested, capacity)} is above the device's maximum "
                    f"{_show(to_quantity(valid_range['max']), capacity)} per allocation")
    return amount


def _show(amount: Decimal, capacity: Capacity) -> str:
    return format_quantity(amount, capacity.text)
