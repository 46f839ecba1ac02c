"""kube-scheduler for the playground's one node: pods with claims get them allocated and are bound.

For each pod without spec.nodeName (and the default or no schedulerName), as the scheduler's
DynamicResources plugin and binder do (k8s.io/kubernetes pkg/scheduler/framework/plugins/
dynamicresources/dynamicresources.go):

- wait until every claim exists (a template's claim: until the resourceclaim controller made it);
  a claim being deleted keeps the pod unschedulable;
- PreBind: add the finalizer resource.kubernetes.io/delete-protection, then allocate the claim
  on the node and reserve it for the pod (the allocation stand-in, allocate_and_reserve);
- when a claim does not fit, undo what this attempt allocated or reserved (Unreserve), set the
  pod's PodScheduled condition False/Unschedulable and record one FailedScheduling Event;
- bind (POST pods/NAME/binding) and record a Scheduled Event.
"""

from __future__ import annotations

from kubernetes.client import ApiClient, CoreV1Api, ResourceV1Api
from kubernetes.client.exceptions import ApiException

from ..kube import JSON, api_error, json_body, plain
from .allocator import AllocationError, allocate_and_reserve
from .claimcontroller import FINALIZER
from .objects import list_all, pod_claim_names, pod_event

COMPONENT = "default-scheduler"
SCHEDULER_NAME = "default-scheduler"


class Unschedulable(Exception):
    """The pod cannot be placed now; the message says why (the FailedScheduling Event's)."""


class Scheduler:
    def __init__(self, api: ApiClient, node_name: str):
        self.api = api
        self.node_name = node_name
        self.core = CoreV1Api(api)
        self.resource = ResourceV1Api(api)
        self._reported: dict[str, str] = {}  # pod uid -> the last FailedScheduling message

    def sync(self) -> None:
        for pod in list_all(self.core.list_pod_for_all_namespaces, field_selector="spec.nodeName="):
            spec, meta = pod.get("spec") or {}, pod["metadata"]
            if spec.get("nodeName") or meta.get("deletionTimestamp") or \
                    (spec.get("schedulerName") or SCHEDULER_NAME) != SCHEDULER_NAME:
                continue
            try:
                self._schedule(pod)
            except Unschedulable as e:
                self._unschedulable(pod, str(e))

    def _schedule(self, pod: JSON) -> None:
        meta = pod["metadata"]
        names = pod_claim_names(pod)
        waiting = [n for n, claim in names.items() if claim is None]
        if waiting:
            raise Unschedulable(f"waiting for resource claim(s) of {', '.join(waiting)} to be created")
        done: list[tuple[str, bool]] = []  # (claim, allocated by this attempt) for Unreserve
        try:
            for claim_name in names.values():
                assert claim_name is not None  # checked above
                claim = self._claim(meta["namespace"], claim_name)
                if claim["metadata"].get("deletionTimestamp"):
                    raise Unschedulable(f'resourceclaim "{claim_name}" is being deleted')
                allocated = bool((claim.get("status") or {}).get("allocation"))
                if not allocated and FINALIZER not in (claim["metadata"].get("finalizers") or []):
                    self.resource.patch_namespaced_resource_claim(claim_name, meta["namespace"], plain(
                        {"metadata": {"finalizers": [*(claim["metadata"].get("finalizers") or []), FINALIZER]}}))
                allocate_and_reserve(self.api, meta["namespace"], claim_name, self.node_name, pod=pod)
                done.append((claim_name, not allocated))
        except AllocationError as e:
            self._unreserve(pod, done)
            raise Unschedulable(f"0/1 nodes are available: 1 cannot allocate all claims ({e})") from None
        except ApiException as e:
            self._unreserve(pod, done)
            raise Unschedulable(f"resource claims: {api_error(e)}") from None
        self.core.create_namespaced_pod_binding(meta["name"], meta["namespace"], plain(
            {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"]},
             "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name}}), _preload_content=False)
        self._reported.pop(meta["uid"], None)
        pod_event(self.api, pod, "Normal", "Scheduled",
                     f"Successfully assigned {meta['namespace']}/{meta['name']} to {self.node_name}", COMPONENT)

    def _claim(self, namespace: str, name: str) -> JSON:
        try:
            return json_body(self.resource.read_namespaced_resource_claim(name, namespace, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                raise Unschedulable(f'resourceclaim "{name}" not found') from None
            raise

    def _unreserve(self, pod: JSON, done: list[tuple[str, bool]]) -> None:
        """Take back what this attempt wrote: the pod's reservation, and allocations it made."""
        for claim_name, allocated_here in done:
            claim = self._claim(pod["metadata"]["namespace"], claim_name)
            status = dict(claim.get("status") or {})
            uid = pod["metadata"]["uid"]
            status["reservedFor"] = [r for r in status.get("reservedFor") or [] if r.get("uid") != uid]
            if allocated_here and not status["reservedFor"]:
                status.pop("allocation", None)
            self.resource.replace_namespaced_resource_claim_status(
                claim_name, pod["metadata"]["namespace"], plain({**claim, "status": status}))

    def _unschedulable(self, pod: JSON, message: str) -> None:
        meta = pod["metadata"]
        if self._reported.get(meta["uid"]) == message:
            return  # said already; the real scheduler retries with backoff and says it again less often
        self._reported[meta["uid"]] = message
        pod_event(self.api, pod, "Warning", "FailedScheduling", message, COMPONENT)
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], plain(
            {"status": {"conditions": [*conditions, condition]}}))
