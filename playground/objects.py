"""API objects as the playground's controllers read and write them: plain JSON (the server's own
fields, known to this client or not), listed whole, and the Events they record."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api

from dra_driver.kube import JSON, json_body, plain, warning_event


def list_all(list_call: Callable[..., Any], **kwargs: Any) -> list[JSON]:
    """Every item of a list call, page by page."""
    items: list[JSON] = []
    token = None
    while True:
        page = json_body(list_call(_preload_content=False, _continue=token, **kwargs))
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


def pod_event(api: ApiClient, pod: JSON, event_type: str, reason: str, message: str, component: str,
              host: str = "") -> None:
    """An Event about the pod, where `kubectl describe pod` and `kubectl get events` show it."""
    meta = pod["metadata"]
    involved = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                "uid": meta["uid"]}
    body = warning_event(involved, reason, message, namespace=meta["namespace"], component=component,
                         reporting_component=component, host=host, event_type=event_type)
    CoreV1Api(api).create_namespaced_event(meta["namespace"], plain(body), _preload_content=False)


def pod_claim_names(pod: JSON) -> dict[str, str | None]:
    """The pod's claims, {name in the pod: ResourceClaim name}; None for one from a template
    whose claim the resourceclaim controller has not generated yet (pod.status.resourceClaimStatuses)."""
    generated = {s["name"]: s.get("resourceClaimName")
                 for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    return {c["name"]: c.get("resourceClaimName") or generated.get(c["name"])
            for c in (pod.get("spec") or {}).get("resourceClaims") or []}


def is_done(pod: JSON) -> bool:
    """No container of the pod runs or will run (upstream resourceclaim controller's isPodDone)."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or \
        bool(pod["metadata"].get("deletionTimestamp") and not (pod.get("spec") or {}).get("nodeName"))
