"""allocate(): choose devices for one claim on one node, as the scheduler's DRA allocator does.

Pure: works on ResourceClaim/ResourceSlice/DeviceClass dicts (camelCase, resource.k8s.io/v1)
and returns the new claim status. The search is a depth-first backtracking over requests in
order, and for each request over its candidate devices in slice order, so the first
solution found is deterministic and constraints (matchAttribute) can undo earlier picks.
"""

from __future__ import annotations

import copy
import re
import uuid
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal

from .cel import SelectorError, matches
from .devices import (
    Device,
    NodePools,
    Unfit,
    consumed_amount,
    format_quantity,
    node_counters,
    node_devices,
    qualify,
    to_quantity,
    untolerated_taint,
)

MAX_STEPS = 200_000  # devices tried before giving up; the real scheduler has a time limit instead
MAX_RESULTS = 32  # devices one claim's allocation may hold (resourceapi.AllocationResultsMaxSize)
_SHOWN_REASONS = 4  # per-device reasons quoted in an error message
_ATTRIBUTE = re.compile(r'device\.attributes\["([^"]+)"\]\.([A-Za-z0-9_]+)')  # domain, name in a selector


class AllocationError(Exception):
    """The claim does not fit; the message names the request and why."""


@dataclass
class _Choice:
    """One way to satisfy a request: its `exactly`, or one of its firstAvailable subrequests."""

    name: str  # the result's request name: "<request>" or "<request>/<subrequest>"
    request: str  # the top-level request name (constraints and configs may name either)
    spec: dict
    device_class: dict
    candidates: list[Device]  # pass all selectors and are not tainted, in slice order
    tainted: list[tuple[Device, dict]]  # pass all selectors but carry a taint not tolerated
    count: int | None  # None: allocationMode All
    capacity_requests: dict[str, Decimal]  # capacity name as written in the claim -> amount
    claim: int = 0  # which of the claims allocated together (a pod's) it belongs to


@dataclass
class _Pick:
    choice: _Choice
    device: Device
    consumed: dict[str, Decimal] | None  # qualified capacity name -> amount; only on shared devices


class _Usage:
    """What the other allocated claims already hold."""

    def __init__(self, allocated_claims: list[dict], claims: list[dict]):
        self.used: set[tuple[str, str, str]] = set()
        self.dedicated: set[tuple[str, str, str]] = set()  # held whole: a result without a shareID
        self.consumed: dict[tuple, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
        for other in allocated_claims:
            if any(_same_claim(other, claim) for claim in claims):
                continue  # its old allocation is being replaced
            allocation = (other.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or []:
                key = (result["driver"], result["pool"], result["device"])
                self.used.add(key)
                if not result.get("shareID"):
                    self.dedicated.add(key)
                for name, amount in (result.get("consumedCapacity") or {}).items():
                    self.consumed[key][qualify(name, result["driver"])] += to_quantity(amount)


def _same_claim(a: dict, b: dict) -> bool:
    ma, mb = a.get("metadata") or {}, b.get("metadata") or {}
    if ma.get("uid") and mb.get("uid"):
        return ma["uid"] == mb["uid"]
    return (ma.get("namespace"), ma.get("name")) == (mb.get("namespace"), mb.get("name"))


def _in_scope(constraint: dict, choice: _Choice) -> bool:
    names = constraint.get("requests") or []
    return not names or choice.request in names or choice.name in names


Constraint = tuple[int, dict]  # the claim it belongs to, the constraint


def _describe(constraint: dict) -> str:
    kind = "matchAttribute" if constraint.get("matchAttribute") else "distinctAttribute"
    scope = constraint.get("requests") or "all requests"
    return f"{kind} {constraint.get(kind)!r} over {scope}"


class _Search:
    def __init__(self, requests: list[list[_Choice]], usage: _Usage, constraints: list[Constraint],
                 counters: dict | None = None):
        self.requests = requests  # per request (of every claim, in order), its choices in order of preference
        self.usage = usage
        self.constraints = constraints
        self.picks: list[_Pick] = []
        self.chosen: list[_Choice] = []
        self.steps = 0
        self.counters = counters or {}  # (driver, pool, set, counter) -> what is left after other claims

    def _counters_fit(self, device: Device) -> None:
        """Unfit when the device's counters are not left (partitionable devices, KEP 4815): a device
        consumes its counters once, however many claims share it."""
        if not device.consumes or device.key in self.usage.used or any(p.device.key == device.key for p in self.picks):
            return
        for (counter_set, name), amount in device.consumes.items():
            key = (device.driver, device.pool, counter_set, name)
            if key not in self.counters:
                continue  # the API server refuses a device naming a counter its pool lacks
            taken = sum(p.device.consumes.get((counter_set, name), Decimal(0)) for p in self._distinct_picks()
                        if (p.device.driver, p.device.pool) == (device.driver, device.pool)
                        and p.device.key not in self.usage.used)
            if taken + amount > self.counters[key]:
                raise Unfit(f"counter {counter_set}/{name}: needs {amount}, "
                            f"{max(self.counters[key] - taken, Decimal(0))} left")

    def _distinct_picks(self) -> list[_Pick]:
        seen, picks = set(), []
        for p in self.picks:
            if p.device.key not in seen:
                seen.add(p.device.key)
                picks.append(p)
        return picks

    def run(self) -> bool:
        return self._solve(0)

    def fit(self, choice: _Choice, device: Device) -> dict[str, Decimal] | None:
        """The capacity the device would give this request next to the picks so far; Unfit if none."""
        requested = {qualify(name, device.driver): amount for name, amount in choice.capacity_requests.items()}
        missing = [name for name in requested if name not in device.capacity]
        if missing:
            raise Unfit(f"has no capacity {', '.join(missing)}")
        self._counters_fit(device)
        if not device.multi:
            if device.key in self.usage.used:
                raise Unfit("allocated to another claim")
            if any(p.device.key == device.key for p in self.picks):
                raise Unfit("already picked for this claim")
            # Capacity requests only filter exclusive devices: the whole device is taken.
            for name, amount in requested.items():
                cap = device.capacity[name]
                if consumed_amount(cap, amount) > cap.value:
                    raise Unfit(f"{cap.key} {format_quantity(amount, cap.text)} is more than the device has")
            return None
        if device.key in self.usage.dedicated:
            raise Unfit("allocated whole to another claim")
        if any(p.device.key == device.key and p.choice is choice for p in self.picks):
            raise Unfit("already picked for this request")
        consumed = {}
        for name, cap in device.capacity.items():
            amount = consumed_amount(cap, requested.get(name))
            taken = self.usage.consumed[device.key][name] + sum(
                p.consumed[name] for p in self.picks if p.device.key == device.key)  # type: ignore[index,misc]  # picks on a shared device carry consumed
            if taken + amount > cap.value:
                raise Unfit(f"{cap.key}: needs {format_quantity(amount, cap.text)}, "
                            f"{format_quantity(cap.value - taken, cap.text)} of "
                            f"{format_quantity(cap.value, cap.text)} left")
            consumed[name] = amount
        return consumed

    def _constraints_hold(self) -> bool:
        for claim, constraint in self.constraints:
            scoped = [p for p in self.picks if p.choice.claim == claim and _in_scope(constraint, p.choice)]
            match, distinct = constraint.get("matchAttribute"), constraint.get("distinctAttribute")
            name = match or distinct
            if not name:
                continue
            values = [p.device.attributes.get(qualify(name, p.device.driver)) for p in scoped]
            if None in values:
                return False  # a device without the attribute never satisfies the constraint
            if match and len(set(values)) > 1 or distinct and len(set(values)) < len(values):
                return False
        return True

    def _solve(self, index: int) -> bool:
        if index == len(self.requests):
            return True
        for choice in self.requests[index]:
            held = sum(p.choice.claim == choice.claim for p in self.picks)
            if held + (len(choice.candidates) if choice.count is None else choice.count) > MAX_RESULTS:
                continue  # the claim's allocation could not hold the results: try its next subrequest
            self.chosen.append(choice)
            if self._fill_all(choice, index) if choice.count is None else self._fill(choice, index, 0, 0):
                return True
            self.chosen.pop()
        return False

    def _fill(self, choice: _Choice, index: int, filled: int, start: int) -> bool:
        assert choice.count is not None  # allocationMode All goes to _fill_all
        if filled == choice.count:
            return self._solve(index + 1)
        # Devices are picked in candidate order, so no set of devices is tried twice.
        for position in range(start, len(choice.candidates) - (choice.count - filled) + 1):
            device = choice.candidates[position]
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise AllocationError(f"request {choice.request!r}: gave up after trying {MAX_STEPS} devices")
            try:
                consumed = self.fit(choice, device)
            except Unfit:
                continue
            self.picks.append(_Pick(choice, device, consumed))
            if self._constraints_hold() and self._fill(choice, index, filled + 1, position + 1):
                return True
            self.picks.pop()
        return False

    def _fill_all(self, choice: _Choice, index: int) -> bool:
        if not choice.candidates:
            return False
        mark = len(self.picks)
        try:
            for device in choice.candidates:
                self.picks.append(_Pick(choice, device, self.fit(choice, device)))
        except Unfit:
            del self.picks[mark:]
            return False
        if self._constraints_hold() and self._solve(index + 1):
            return True
        del self.picks[mark:]
        return False


class _Allocator:
    """One claim of those allocated together: its requests' choices, constraints and configs."""

    def __init__(self, claim: dict, index: int, node_name: str, pools: NodePools, classes: dict, usage: _Usage,
                 counters: dict):
        self.claim = claim
        self.index = index
        self.node_name = node_name
        self.pools = pools
        self.devices = pools.devices
        self.classes = classes
        self.usage = usage
        self.counters = counters  # what other claims' devices left of the pools' shared counters
        spec = (claim.get("spec") or {}).get("devices") or {}
        self.constraints = spec.get("constraints") or []
        self.claim_configs = spec.get("config") or []
        self.requests = [self._choices(r) for r in spec.get("requests") or []]
        # As upstream: a claim that would need more results than an allocation holds fails at once.
        fewest = sum(min(len(c.candidates) if c.count is None else c.count for c in choices)
                     for choices in self.requests)
        if fewest > MAX_RESULTS:
            raise AllocationError(f"claim {self.label}: number of requested devices {fewest} exceeds the claim "
                                  f"limit of {MAX_RESULTS}")

    @property
    def label(self) -> str:
        meta = self.claim.get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"

    @property
    def tagged_constraints(self) -> list[Constraint]:
        return [(self.index, c) for c in self.constraints]

    def _choices(self, request: dict) -> list[_Choice]:
        if request.get("firstAvailable"):
            return [self._choice(f"{request['name']}/{sub['name']}", request["name"], sub)
                    for sub in request["firstAvailable"]]
        return [self._choice(request["name"], request["name"], request.get("exactly") or {})]

    def _choice(self, name: str, request: str, spec: dict) -> _Choice:
        class_name = spec.get("deviceClassName")
        if not class_name:
            raise AllocationError(f"request {name!r}: no deviceClassName")
        device_class = self.classes.get(class_name)
        if device_class is None:
            raise AllocationError(f"request {name!r}: device class {class_name!r} not found")
        selectors = ((device_class.get("spec") or {}).get("selectors") or []) + (spec.get("selectors") or [])
        expressions = [s["cel"]["expression"] for s in selectors if s.get("cel")]
        try:
            selected = [d for d in self.devices if all(matches(e, d) for e in expressions)]
        except SelectorError as e:
            raise AllocationError(f"request {name!r}: {e}") from None
        candidates, tainted = [], []
        for device in selected:
            taint = untolerated_taint(device, spec.get("tolerations") or [])
            candidates.append(device) if taint is None else tainted.append((device, taint))
        mode = spec.get("allocationMode") or "ExactCount"
        if mode not in ("ExactCount", "All"):
            raise AllocationError(f"request {name!r}: unknown allocationMode {mode!r}")
        if mode == "All":  # "all" cannot be known while a pool is being published or is broken
            for driver, pool in sorted(self.pools.incomplete):
                raise AllocationError(f"request {name!r}: asks for all devices, but resource pool {driver}/{pool} "
                                      "is currently being updated")
            for (driver, pool), why in sorted(self.pools.invalid.items()):
                raise AllocationError(f"request {name!r}: asks for all devices, but resource pool {driver}/{pool} "
                                      f"is currently invalid ({why})")
        try:
            capacity_requests = {n: to_quantity(v) for n, v in
                                 ((spec.get("capacity") or {}).get("requests") or {}).items()}
        except Unfit as e:
            raise AllocationError(f"request {name!r}: capacity.requests: {e}") from None
        count = None if mode == "All" else int(spec.get("count", 1))
        return _Choice(name, request, spec, device_class, candidates, tainted, count, capacity_requests, self.index)

    def allocation(self, search: _Search) -> dict:
        """This claim's part of a search that succeeded."""
        picks = [p for p in search.picks if p.choice.claim == self.index]
        chosen = [c for c in search.chosen if c.claim == self.index]
        return {
            "devices": {"results": [self._result(p) for p in picks], "config": self._configs(chosen)},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [self.node_name]}]}]},
        }

    def fits_alone(self) -> bool:
        return _Search(self.requests, self.usage, self.tagged_constraints, self.counters).run()

    @staticmethod
    def _result(pick: _Pick) -> dict:
        device = pick.device
        result: dict[str, object] = {"request": pick.choice.name, "driver": device.driver, "pool": device.pool,
                                     "device": device.name}
        if pick.consumed is not None:
            # Each allocation on a shared device gets its own ID (the plugin names CDI devices by it).
            result["shareID"] = str(uuid.uuid4())
            result["consumedCapacity"] = {cap.key: format_quantity(pick.consumed[name], cap.text)
                                          for name, cap in device.capacity.items()}
        if pick.choice.spec.get("tolerations"):
            result["tolerations"] = copy.deepcopy(pick.choice.spec["tolerations"])
        return result

    def _configs(self, chosen: list[_Choice]) -> list[dict]:
        """Class configs first (scoped to the request that used the class), then the claim's."""
        configs = []
        for choice in chosen:
            for entry in (choice.device_class.get("spec") or {}).get("config") or []:
                configs.append({"source": "FromClass", "requests": [choice.name],
                                **{k: copy.deepcopy(v) for k, v in entry.items() if k != "requests"}})
        for entry in self.claim_configs:
            names = entry.get("requests") or []
            # Drop configs that only name subrequests which were not chosen.
            if names and not any(n in (c.request, c.name) for n in names for c in chosen):
                continue
            configs.append({"source": "FromClaim", **copy.deepcopy(entry)})
        return configs

    def _explain(self) -> str:
        """Why the search failed: the first request that cannot be met even alone, else the combination."""
        for choices in self.requests:
            reasons = [self._alone(choice) for choice in choices]
            if all(reasons):
                if len(choices) == 1:
                    return f"request {choices[0].name!r}: {reasons[0]}"
                return f"request {choices[0].request!r}: no subrequest can be satisfied: " + "; ".join(
                    f"{c.name}: {r}" for c, r in zip(choices, reasons, strict=True))
        names = [choices[0].request for choices in self.requests]
        if self.constraints:
            return (f"requests {names}: each fits alone but not together under the constraints "
                    + ", ".join(_describe(c) for c in self.constraints))
        return f"requests {names}: each fits alone but not all together (not enough devices or capacity left)"

    def _attribute_values(self, choice: _Choice) -> str:
        """What the node's devices have of the attributes the class selects on, so the author sees
        why none matched: `; their gpushare.dev/sharingStrategy: TimeSlicing (all 2)`. The real
        scheduler says only that the claims cannot be allocated."""
        names = []
        for sel in (choice.device_class.get("spec") or {}).get("selectors") or []:
            for domain, name in _ATTRIBUTE.findall(str((sel.get("cel") or {}).get("expression", ""))):
                if (qualified := f"{domain}/{name}") not in names:
                    names.append(qualified)
        parts = []
        for qualified in names:
            values: dict[str, int] = {}
            for device in self.devices:
                typed = device.attributes.get(qualified)
                value = "(none)" if typed is None else str(typed[1])
                values[value] = values.get(value, 0) + 1
            if values:
                shown = ", ".join(f"{v} ({n})" if len(values) > 1 else f"{v} (all {n})" for v, n in values.items())
                parts.append(f"{qualified}: {shown}")
        return "; their " + "; ".join(parts) if parts else ""

    def _alone(self, choice: _Choice) -> str | None:
        """Why this choice cannot be satisfied even as the claim's only request; None if it can."""
        if not choice.candidates:
            if choice.tainted:
                device, taint = choice.tainted[0]
                return (f"{len(choice.tainted)} matching device(s) are tainted and not tolerated "
                        f"({device.name}: {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')})")
            selects = " && ".join(_grouped(str((sel.get("cel") or {}).get("expression", "")).strip())
                                  for sel in (choice.device_class.get("spec") or {}).get("selectors") or [])
            if len(selects) > 240:
                selects = selects[:237] + "..."
            what = f" ({selects})" if selects else ""
            return (f"no device on the node matches device class {choice.spec['deviceClassName']!r}{what} "
                    f"and the request's selectors ({len(self.devices)} devices on the node"
                    f"{self._attribute_values(choice)})")
        probe = _Search([[choice]], self.usage, [], self.counters)
        unfit = []
        for device in choice.candidates:
            try:
                probe.fit(choice, device)
            except Unfit as e:
                unfit.append((device.name, str(e)))
        shown = _by_reason(unfit)
        if choice.count is None:
            if unfit:
                return f"allocationMode All needs every matching device, but {shown}"
        elif choice.count > len(choice.candidates):
            return f"count {choice.count} is more than the {len(choice.candidates)} matching device(s)"
        elif choice.count > len(choice.candidates) - len(unfit):
            return (f"needs {choice.count} device(s), only {len(choice.candidates) - len(unfit)} of "
                    f"{len(choice.candidates)} matching device(s) can take it: {shown}")
        scoped = [c for c in self.constraints if _in_scope(c, choice)]
        if scoped and not _Search([[choice]], self.usage, [(self.index, c) for c in scoped], self.counters).run():
            return "no set of devices satisfies " + ", ".join(_describe(c) for c in scoped)
        return None


def _grouped(expression: str) -> str:
    """A selector as one term of an `&&` of them: parenthesized when it has an `||`."""
    return f"({expression})" if "||" in expression else expression


def _by_reason(unfit: list[tuple[str, str]]) -> str:
    """Per-device reasons grouped, the most common first, so the cause leads however many devices
    there are: `allocated to another claim (8 devices: gpu-0-share-0, gpu-0-share-1, ...)`."""
    devices: dict[str, list[str]] = {}
    for name, reason in unfit:
        devices.setdefault(reason, []).append(name)
    groups = sorted(devices.items(), key=lambda item: -len(item[1]))
    parts = []
    for reason, names in groups[:_SHOWN_REASONS]:
        listed = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        parts.append(f"{reason} ({listed})" if len(names) == 1 else f"{reason} ({len(names)} devices: {listed})")
    return "; ".join(parts) + ("; ..." if len(groups) > _SHOWN_REASONS else "")


def allocate(claim: dict, *, node_name: str, slices: list[dict], device_classes: list[dict],
             allocated_claims: list[dict], pod: dict | None = None) -> dict:
    """The new claim status: an allocation on `node_name` and the pod (if given) in reservedFor.

    Raises AllocationError when the claim does not fit.
    """
    return allocate_claims([claim], node_name=node_name, slices=slices, device_classes=device_classes,
                           allocated_claims=allocated_claims, pod=pod)[0]


def allocate_claims(claims: list[dict], *, node_name: str, slices: list[dict], device_classes: list[dict],
                    allocated_claims: list[dict], pod: dict | None = None) -> list[dict]:
    """The new statuses of claims allocated together (a pod's), in their order: one search over
    all their requests, so a later claim can undo an earlier claim's pick, as upstream's allocator
    does (`small-and-large-backtrack-claims`).

    Raises AllocationError when they do not all fit.
    """
    try:
        pools = node_devices(slices, node_name)
    except Unfit as e:
        raise AllocationError(f"node {node_name!r}: unusable ResourceSlice: {e}") from None
    classes = {c["metadata"]["name"]: c for c in device_classes}
    usage = _Usage(allocated_claims, claims)
    # what other claims' devices left of the pools' shared counters: each allocated device once
    counters = node_counters(slices, node_name)
    for device in pools.devices:
        if device.key in usage.used:
            for (counter_set, name), amount in device.consumes.items():
                key = (device.driver, device.pool, counter_set, name)
                if key in counters:
                    counters[key] -= amount
    plans = [_Allocator(claim, i, node_name, pools, classes, usage, counters) for i, claim in enumerate(claims)]
    search = _Search([r for plan in plans for r in plan.requests], usage,
                     [c for plan in plans for c in plan.tagged_constraints], counters)
    if not search.run():
        raise AllocationError(_why_not(plans, node_name))
    reserved = [pod_reference(pod)] if pod else []
    return [{"allocation": plan.allocation(search), "reservedFor": list(reserved)} for plan in plans]


def _why_not(plans: list[_Allocator], node_name: str) -> str:
    """The first claim that does not fit even alone and why, else that they do not fit together;
    and the invalid pools that were left out (upstream's "invalid resource pools were encountered")."""
    pools = plans[0].pools if plans else NodePools([], set(), {})
    left_out = ("; invalid resource pools were encountered: " + ", ".join(
        f"{driver}/{pool} ({why})" for (driver, pool), why in sorted(pools.invalid.items()))) if pools.invalid else ""
    if pools.incomplete:
        left_out += "; pools still being published were left out: " + ", ".join(
            f"{driver}/{pool}" for driver, pool in sorted(pools.incomplete))
    for plan in plans:
        if not plan.fits_alone():
            return f"cannot allocate claim {plan.label} on node {node_name!r}: {plan._explain()}{left_out}"
    return (f"cannot allocate claims {[plan.label for plan in plans]} on node {node_name!r}: each fits alone but "
            f"not all together (not enough devices or capacity left){left_out}")


def pod_reference(pod: dict) -> dict:
    meta = pod["metadata"]
    return {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
