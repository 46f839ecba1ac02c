"""Feature gates: with a gate off, the real server silently drops that feature's fields on write."""

import copy


def _drop(items, *fields):
    for item in items or []:
        if isinstance(item, dict):
            for name in fields:
                item.pop(name, None)


def _drop_claim_spec_capacity(claim_spec):
    for request in ((claim_spec or {}).get("devices") or {}).get("requests") or []:
        _drop([request.get("exactly")], "capacity")
        _drop(request.get("firstAvailable"), "capacity")


def drop_disabled_fields(rt, obj, consumable_capacity=True, device_taints=True):
    """A copy of obj without the fields of disabled features (obj itself when nothing is off)."""
    if consumable_capacity and device_taints:
        return obj
    obj = copy.deepcopy(obj)
    spec = obj.get("spec") or {}
    if rt.kind == "ResourceSlice":
        devices = spec.get("devices") or []
        if not consumable_capacity:
            _drop(devices, "allowMultipleAllocations")
            for device in devices:
                _drop((device.get("capacity") or {}).values(), "requestPolicy")
        if not device_taints:
            _drop(devices, "taints")
    elif rt.kind == "ResourceClaim" and not consumable_capacity:
        _drop_claim_spec_capacity(spec)
        status = obj.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results")
        _drop(results, "shareID", "consumedCapacity")
        _drop(status.get("devices"), "shareID")
    elif rt.kind == "ResourceClaimTemplate" and not consumable_capacity:
        _drop_claim_spec_capacity(spec.get("spec"))
    return obj
