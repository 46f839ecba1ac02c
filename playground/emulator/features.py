"""Feature gates: with a gate off, the real server silently drops that feature's fields on write.

Which gates are on by default in each release comes from the versioned feature specs in
kubernetes pkg/features/kube_features.go (1.37: the scheduler-related DRA gates; the kubelet's
ResourceHealthStatus), checked against the KEPs' kep.yaml milestones in kubernetes/enhancements.
"""

import copy
from collections.abc import Mapping

CONSUMABLE_CAPACITY = "DRAConsumableCapacity"  # KEP-5075
DEVICE_TAINTS = "DRADeviceTaints"  # KEP-5055
PARTITIONABLE_DEVICES = "DRAPartitionableDevices"  # KEP-4815
EXTENDED_RESOURCE = "DRAExtendedResource"  # KEP-5004
PRIORITIZED_LIST = "DRAPrioritizedList"  # KEP-4816
RESOURCE_HEALTH_STATUS = "ResourceHealthStatus"  # KEP-4680

# gate -> [(first release, on by default from then)], as in the upstream VersionedSpecs.
GATE_HISTORY: dict[str, list[tuple[tuple[int, int], bool]]] = {
    CONSUMABLE_CAPACITY: [((1, 34), False), ((1, 36), True)],  # alpha, beta
    DEVICE_TAINTS: [((1, 33), False), ((1, 36), True)],  # alpha, beta; GA 1.37
    PARTITIONABLE_DEVICES: [((1, 33), False), ((1, 36), True)],  # alpha, beta
    EXTENDED_RESOURCE: [((1, 34), False), ((1, 36), True)],  # alpha, beta; GA 1.37
    PRIORITIZED_LIST: [((1, 33), False), ((1, 34), True)],  # alpha, beta; GA 1.36
    RESOURCE_HEALTH_STATUS: [((1, 31), False), ((1, 36), True)],  # alpha, beta
}


def default_gates(kube_version: str) -> dict[str, bool]:
    """{gate: on by default} in the release kube_version ('1.35')."""
    wanted = tuple(int(p) for p in kube_version.lstrip("v").split(".")[:2])
    gates = {}
    for gate, history in GATE_HISTORY.items():
        gates[gate] = False
        for since, enabled in history:
            if wanted >= since:
                gates[gate] = enabled
    return gates


def _drop(items, *fields):
    for item in items or []:
        if isinstance(item, dict):
            for name in fields:
                item.pop(name, None)


def _drop_claim_spec_capacity(claim_spec):
    for request in ((claim_spec or {}).get("devices") or {}).get("requests") or []:
        _drop([request.get("exactly")], "capacity")
        _drop(request.get("firstAvailable"), "capacity")


def drop_disabled_fields(rt, obj, gates: Mapping[str, bool]):
    """A copy of obj without the fields of the gates that are off (obj itself when none applies).

    Modelled: consumable capacity, device taints, a DeviceClass's extendedResourceName
    (deviceclass strategy.go dropDisabledDRAExtendedResourceFields) and a pod's
    allocatedResourcesStatus (pkg/api/pod/util.go dropDisabledPodStatusFields: dropped from every
    container status, old values or not). Not modelled: the partitionable-devices fields (the
    driver publishes no counters) and the "already in use" exceptions on update."""
    capacity, taints = gates[CONSUMABLE_CAPACITY], gates[DEVICE_TAINTS]
    if rt.kind in ("ResourceSlice", "ResourceClaim", "ResourceClaimTemplate") and capacity and taints:
        return obj
    if rt.kind == "DeviceClass" and gates[EXTENDED_RESOURCE]:
        return obj
    if rt.kind == "Pod" and gates[RESOURCE_HEALTH_STATUS]:
        return obj
    obj = copy.deepcopy(obj)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if rt.kind == "ResourceSlice":
        devices = spec.get("devices") or []
        if not capacity:
            _drop(devices, "allowMultipleAllocations")
            for device in devices:
                _drop((device.get("capacity") or {}).values(), "requestPolicy")
        if not taints:
            _drop(devices, "taints")
    elif rt.kind == "ResourceClaim" and not capacity:
        _drop_claim_spec_capacity(spec)
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results")
        _drop(results, "shareID", "consumedCapacity")
        _drop(status.get("devices"), "shareID")
    elif rt.kind == "ResourceClaimTemplate" and not capacity:
        _drop_claim_spec_capacity(spec.get("spec"))
    elif rt.kind == "DeviceClass":
        spec.pop("extendedResourceName", None)
    elif rt.kind == "Pod":
        for group in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            _drop(status.get(group), "allocatedResourcesStatus")
    return obj
