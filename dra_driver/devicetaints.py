"""Device taints and tolerations as kube-scheduler judges them (resource.k8s.io/v1 DeviceTaint and
DeviceToleration): one matcher for `gpushare-dra explain` and the playground's allocator."""

from __future__ import annotations

from collections.abc import Iterable

from .kube import JSON

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")  # "None" only informs


def tolerates(toleration: JSON, taint: JSON) -> bool:
    """As DeviceToleration.ToleratesTaint: an empty effect matches every effect, an empty key
    (with Exists) every key; Equal compares the values."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if (toleration.get("operator") or "Equal") == "Exists":
        return True
    return bool(toleration.get("key")) and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated(taints: Iterable[JSON], tolerations: Iterable[JSON]) -> list[JSON]:
    """The taints that keep the scheduler off a device for a request with these tolerations."""
    tolerations = list(tolerations)
    return [t for t in taints if t.get("effect") in BLOCKING_EFFECTS and not any(tolerates(o, t) for o in tolerations)]
