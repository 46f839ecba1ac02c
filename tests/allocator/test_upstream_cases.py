"""Upstream's own allocator cases, translated, against the allocation stand-in.

Each case is one entry of the table in k8s.io/dynamic-resource-allocation
structured/internal/allocatortesting/allocator_testing.go (the release-1.37 line), under its
upstream name: the same claims, classes, slices and already allocated devices, and upstream's
expected outcome. Upstream allocates all claims of a pod at once (allocate_claims); where it
expects an error or no result, the stand-in must refuse (AllocationError). The cases are those
where the stand-in decided differently before (issue 41: incomplete and invalid pools, the
32-result limit, backtracking across a pod's claims, a device held whole by another claim) and
their neighbours in the table; what the stand-in still decides differently is listed in
docs/emulator.md ("The allocation stand-in against upstream's cases").
"""

from __future__ import annotations

from typing import Any

import pytest

from playground.allocator import AllocationError, allocate_claims

DRIVER_A, DRIVER_B = "driver-a", "driver-b"
CLASS_A, CLASS_B = "class-a", "class-b"
NODE = "node-1"
MAX_RESULTS = 32  # resourceapi.AllocationResultsMaxSize
FAILS = None  # upstream: an error, or no allocation on this node


def device_class(name: str, driver: str, multi: bool | None = None) -> dict[str, Any]:
    expression = f'device.driver == "{driver}"'
    if multi is not None:
        expression += f" && device.allowMultipleAllocations == {str(multi).lower()}"
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def device(name: str, capacity: dict[str, str] | None = None, *, multi: bool = False,
           policy_range: dict[str, str] | None = None) -> dict[str, Any]:
    """upstream's device(); policy_range: withCapacityRequestPolicyRange (default 2, min 2, step 2, max 4)."""
    d: dict[str, Any] = {"name": name}
    if capacity:
        d["capacity"] = {k: {"value": v} for k, v in capacity.items()}
    if policy_range:
        d.setdefault("capacity", {}).update({k: {"value": v, "requestPolicy": {
            "default": "2", "validRange": {"min": "2", "step": "2", "max": "4"}}} for k, v in policy_range.items()})
    if multi:
        d["allowMultipleAllocations"] = True
    return d


def resource_slice(name: str, pool: str, *devices: dict[str, Any], driver: str = DRIVER_A, count: int = 1,
                   generation: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "driver": driver, "nodeName": NODE, "devices": list(devices),
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": count}}}


def request(name: str, cls: str, count: int = 1, *selectors: str, capacity: str | None = None,
            mode: str = "ExactCount") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": mode,
                               "selectors": [{"cel": {"expression": e}} for e in selectors]}
    if mode == "ExactCount":
        exactly["count"] = count
    if capacity is not None:
        exactly["capacity"] = {"requests": {"capacity-0": capacity}}
    return {"name": name, "exactly": exactly}


def first_available(name: str, *subrequests: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": [{"name": s["name"], **s["exactly"]} for s in subrequests]}


def claim(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": list(requests)}}}


def held(pool: str, name: str, *, driver: str = DRIVER_A, consumed: dict[str, str] | None = None) -> dict[str, Any]:
    """upstream's allocatedDevices (held whole) or allocatedCapacityDevices (a share: consumed)."""
    result: dict[str, Any] = {"request": "other", "driver": driver, "pool": pool, "device": name}
    if consumed is not None:
        result.update(shareID="bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb", consumedCapacity=consumed)
    return {"metadata": {"name": f"held-{pool}-{name}"},
            "status": {"allocation": {"devices": {"results": [result]}}}}


def mem(size: str) -> str:
    return f'device.capacity["{DRIVER_A}"].memory.compareTo(quantity("{size}")) >= 0'


SMALL_LARGE = [resource_slice("slice-1", "pool-1", device("device-2", {"memory": "2Gi"}),
                              device("device-1", {"memory": "1Gi"}))]
INVALID_POOL = [resource_slice("slice-1", "pool-1", device("device-1"), count=2),
                resource_slice("slice-2", "pool-1", device("device-1"), count=2),
                resource_slice("slice-3", "pool-2", device("device-2"))]
DUPLICATE = resource_slice("slice-1", "pool-1", device("device-1"), count=2)

# name: (claims, classes, slices, already allocated, upstream's results per claim or FAILS)
CASES: dict[str, tuple[list, list, list, list, Any]] = {
    "small-and-large-backtrack-requests": (
        [claim("claim-0", request("req-0", CLASS_A, 1, mem("1Gi")), request("req-1", CLASS_A, 1, mem("2Gi")))],
        [device_class(CLASS_A, DRIVER_A)], SMALL_LARGE, [],
        [[("req-0", "pool-1", "device-1"), ("req-1", "pool-1", "device-2")]]),
    "small-and-large-backtrack-claims": (
        [claim("claim-0", request("req-0", CLASS_A, 1, mem("1Gi"))),
         claim("claim-1", request("req-1", CLASS_A, 1, mem("2Gi")))],
        [device_class(CLASS_A, DRIVER_A)], SMALL_LARGE, [],
        [[("req-0", "pool-1", "device-1")], [("req-1", "pool-1", "device-2")]]),
    "devices-split-across-different-slices": (
        [claim("claim-0", request("req-0", CLASS_A, 2))], [device_class(CLASS_A, DRIVER_A)],
        [resource_slice("slice-1", "pool-1", device("device-1")),
         resource_slice("slice-2", "pool-2", device("device-1"))],
        [], [[("req-0", "pool-1", "device-1"), ("req-0", "pool-2", "device-1")]]),
    "obsolete-slice": (
        [claim("claim-0", request("req-0", CLASS_A))], [device_class(CLASS_A, DRIVER_A)],
        [resource_slice("slice-1-obsolete", "pool-1", device("device-1"), count=2),
         resource_slice("slice-1-obsolete", "pool-1", device("device-2"), count=2, generation=2)], [], FAILS),
    "duplicate-slice": (
        [claim("claim-0", request("req-0", CLASS_A))], [device_class(CLASS_A, DRIVER_A)],
        [DUPLICATE, {**DUPLICATE, "metadata": {"name": "slice-1-2"}}], [], FAILS),
    "no-slices": ([claim("claim-0", request("req-0", CLASS_A))], [device_class(CLASS_A, DRIVER_A)], [], [], FAILS),
    "not-enough-suitable-devices": (
        [claim("claim-0", request("req-0", CLASS_A)), claim("claim-0", request("req-1", CLASS_A))],
        [device_class(CLASS_A, DRIVER_A)], [resource_slice("slice-1", "pool-1", device("device-1"))], [], FAILS),
    "all-devices-of-the-incomplete-pool": (
        [claim("claim-0", request("req-0", CLASS_A, mode="All"))], [device_class(CLASS_A, DRIVER_A)],
        [resource_slice("slice-1", "pool-1", device("device-1"), count=2)], [], FAILS),
    "too-many-devices-single-request": (
        [claim("claim-0", request("req-0", CLASS_A, 500))], [device_class(CLASS_A, DRIVER_A)], [], [], FAILS),
    "many-devices-okay": (  # no slices: nothing to allocate, but no error either
        [claim("claim-0", request("req-0", CLASS_A, MAX_RESULTS))], [device_class(CLASS_A, DRIVER_A)], [], [], FAILS),
    "too-many-devices-total": (
        [claim("claim-0", request("req-0", CLASS_A, MAX_RESULTS), request("req-1", CLASS_A, 1))],
        [device_class(CLASS_A, DRIVER_A)],
        [resource_slice("slice-1", "pool-1", *(device(f"device-{i}") for i in range(MAX_RESULTS + 1)))], [], FAILS),
    "prioritized-list-too-many-in-first-subrequest": (
        [claim("claim-0", first_available("req-0", request("subReq-0", CLASS_B, 500), request("subReq-1", CLASS_A)))],
        [device_class(CLASS_A, DRIVER_A), device_class(CLASS_B, DRIVER_B)],
        [resource_slice("slice-1", "pool-1", device("device-1"))], [],
        [[("req-0/subReq-1", "pool-1", "device-1")]]),
    "allow-multiple-allocations-not-allocate-multi-allocatable-device-which-already-dedicated": (
        [claim("claim-0", request("req-0", CLASS_A, 1, capacity="1"))], [device_class(CLASS_A, DRIVER_A, multi=True)],
        [resource_slice("slice-1", "pool-1", device("device-1", multi=True, policy_range={"capacity-0": "2"}))],
        [held("pool-1", "device-1")], FAILS),
    "allow-multiple-allocations-not-allocate-dedicated-device-which-change-from-multi-allocatable": (
        [claim("claim-0", request("req-0", CLASS_A, 1, capacity="1"))], [device_class(CLASS_A, DRIVER_A, multi=True)],
        [resource_slice("slice-1", "pool-1", device("device-1", policy_range={"capacity-0": "2"}))],
        [held("pool-1", "device-1", consumed={"capacity-0": "1"})], FAILS),
    "invalid-pool-is-ok-if-devices-can-be-allocated-from-other": (
        [claim("claim-0", request("req-0", CLASS_A))], [device_class(CLASS_A, DRIVER_A)], INVALID_POOL, [],
        [[("req-0", "pool-2", "device-2")]]),
    "invalid-pool-is-error-if-no-other-device-can-be-allocated": (
        [claim("claim-0", request("req-0", CLASS_A))], [device_class(CLASS_A, DRIVER_A)], INVALID_POOL,
        [held("pool-2", "device-2")], FAILS),
    "no-allocation-from-incomplete-pools": (
        [claim("claim-0", request("req-0", CLASS_A))], [device_class(CLASS_A, DRIVER_A)],
        [resource_slice("slice-1", "pool-1", device("device-1"), count=2)], [], FAILS),
}


def outcome(claims: list, classes: list, slices: list, allocated: list) -> Any:
    """What the stand-in decides, in the form of upstream's expectation."""
    try:
        statuses = allocate_claims(claims, node_name=NODE, slices=slices, device_classes=classes,
                                   allocated_claims=allocated)
    except AllocationError:
        return FAILS
    return [[(r["request"], r["pool"], r["device"]) for r in s["allocation"]["devices"]["results"]] for s in statuses]


@pytest.mark.parametrize("name", CASES)
def test_upstream_case(name: str) -> None:
    claims, classes, slices, allocated, expected = CASES[name]
    assert outcome(claims, classes, slices, allocated) == expected


def test_invalid_pool_is_named_when_nothing_else_fits() -> None:
    """Upstream says "invalid resource pools were encountered"; the stand-in names the pool and why."""
    claims, classes, slices, allocated, _ = CASES["invalid-pool-is-error-if-no-other-device-can-be-allocated"]
    with pytest.raises(AllocationError, match=r"invalid resource pools were encountered: "
                                              r"driver-a/pool-1 \(duplicate device name device-1\)"):
        allocate_claims(claims, node_name=NODE, slices=slices, device_classes=classes, allocated_claims=allocated)


def test_result_limit_is_named() -> None:
    claims, classes, slices, allocated, _ = CASES["too-many-devices-total"]
    with pytest.raises(AllocationError, match="number of requested devices 33 exceeds the claim limit of 32"):
        allocate_claims(claims, node_name=NODE, slices=slices, device_classes=classes, allocated_claims=allocated)


def test_the_playgrounds_scheduler_allocates_a_pods_claims_together():
    """small-and-large-backtrack-claims through the playground's scheduler and the API emulator:
    the pod's first claim alone would take the large device (listed first), leaving the second
    claim nothing; allocated together, the first takes the small one and the pod is bound."""
    from kubernetes import client

    from playground.emulator import ApiEmulator
    from playground.scheduler import Scheduler

    with ApiEmulator() as emu, emu.api_client() as api_client:
        resource, core = client.ResourceV1Api(api_client), client.CoreV1Api(api_client)
        resource.create_device_class(device_class(CLASS_A, DRIVER_A))
        resource.create_resource_slice(SMALL_LARGE[0])
        for name, size in (("claim-0", "1Gi"), ("claim-1", "2Gi")):
            resource.create_namespaced_resource_claim("default", claim(name, request(f"req-{name[-1]}", CLASS_A, 1,
                                                                                     mem(size))))
        core.create_namespaced_pod("default", {"metadata": {"name": "pod"}, "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "resourceClaims": [{"name": n, "resourceClaimName": n} for n in ("claim-0", "claim-1")]}})
        Scheduler(api_client, NODE).sync()
        assert core.read_namespaced_pod("pod", "default").spec.node_name == NODE
        got = {n: [(r.pool, r.device) for r in resource.read_namespaced_resource_claim(
            n, "default").status.allocation.devices.results] for n in ("claim-0", "claim-1")}
        assert got == {"claim-0": [("pool-1", "device-1")], "claim-1": [("pool-1", "device-2")]}
