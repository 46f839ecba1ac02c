"""kube-scheduler for the playground's one node: pods with claims get them allocated and are bound.

For each pod without spec.nodeName (and the default or no schedulerName), as the scheduler's
DynamicResources plugin and binder do (k8s.io/kubernetes pkg/scheduler/framework/plugins/
dynamicresources/dynamicresources.go):

- wait until every claim exists (a template's claim: until the resourceclaim controller made it);
  a claim being deleted keeps the pod unschedulable;
- Filter: the pod's unallocated claims are allocated together in memory, in one search
  (allocate_together), so a later claim can undo an earlier claim's pick;
- PreBind: add the finalizer resource.kubernetes.io/delete-protection, then write each claim's
  allocation that Filter found and reserve it for the pod (allocate_and_reserve);
- when a claim does not fit, undo what this attempt allocated or reserved (Unreserve), set the
  pod's PodScheduled condition False/Unschedulable and record one FailedScheduling Event;
- bind (POST pods/NAME/binding) and record a Scheduled Event.

A pod whose containers request extended resources backed by DRA (extended.py) gets, as the
plugin's extended-resource path does (extendeddynamicresources.go): each such resource the node
does not list in status.allocatable (a device plugin's) is allocated through DRA, one that is
neither is unschedulable (`Insufficient <name>`, as NodeResourcesFit says); the special claim is
tried in memory with the pod's own claims (Filter), then created, allocated and reserved like them
(PreBind), and pod.status.extendedResourceClaimStatus written before the binding. A claim left
by an attempt that did not bind is deleted and the pod tried again (PostFilter); one created by
a failing attempt is deleted (Unreserve).
"""

from __future__ import annotations

from kubernetes.client import ApiClient, CoreV1Api, ResourceV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from dra_driver.kube import JSON, api_error, json_body, plain
from playground import extended

from .allocator import AllocationError, allocate_and_reserve, allocate_together
from .claimcontroller import FINALIZER
from .objects import list_all, pod_claim_names, pod_event

COMPONENT = "default-scheduler"
EXTENDED = "<extended-resources>"  # the special claim's name in Filter, before it is created
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
        special = self._extended_claim(pod)  # (claim body, requestMappings) or None
        claims = [self._claim(meta["namespace"], n) for n in names.values() if n is not None]
        for claim in claims:
            if claim["metadata"].get("deletionTimestamp"):
                raise Unschedulable(f'resourceclaim "{claim["metadata"]["name"]}" is being deleted')
        planned = self._filter(pod, claims, special[0] if special else None)
        done: list[tuple[str, bool]] = []  # (claim, allocated by this attempt) for Unreserve
        created = ""
        try:
            if special:
                created = json_body(self.resource.create_namespaced_resource_claim(
                    meta["namespace"], plain(special[0]), _preload_content=False))["metadata"]["name"]
                claims.append(self._claim(meta["namespace"], created))
                planned[created] = planned.pop(EXTENDED)
            for claim in claims:
                claim_name = claim["metadata"]["name"]
                allocated = bool((claim.get("status") or {}).get("allocation"))
                if not allocated and FINALIZER not in (claim["metadata"].get("finalizers") or []):
                    self.resource.patch_namespaced_resource_claim(claim_name, meta["namespace"], plain(
                        {"metadata": {"finalizers": [*(claim["metadata"].get("finalizers") or []), FINALIZER]}}))
                allocate_and_reserve(self.api, meta["namespace"], claim_name, self.node_name, pod=pod,
                                     planned=planned.get(claim_name))
                done.append((claim_name, not allocated))
            if special:
                self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], plain({"status": {
                    "extendedResourceClaimStatus": {"resourceClaimName": created, "requestMappings": special[1]}}}))
        except AllocationError as e:
            self._unreserve(pod, done, created)
            raise Unschedulable(f"0/1 nodes are available: 1 cannot allocate all claims ({e})") from None
        except ApiException as e:
            self._unreserve(pod, done, created)
            raise Unschedulable(f"resource claims: {api_error(e)}") from None
        self.core.create_namespaced_pod_binding(meta["name"], meta["namespace"], plain(
            {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"]},
             "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name}}), _preload_content=False)
        self._reported.pop(meta["uid"], None)
        pod_event(self.api, pod, "Normal", "Scheduled",
                     f"Successfully assigned {meta['namespace']}/{meta['name']} to {self.node_name}", COMPONENT)

    def _filter(self, pod: JSON, claims: list[JSON], special: JSON | None) -> dict[str, JSON]:
        """Filter: claim name -> the allocation found for each unallocated claim of the pod (the
        special claim, not yet created, as EXTENDED), all in one search; Unschedulable when they
        do not fit together."""
        pending = [c for c in claims if not (c.get("status") or {}).get("allocation")]
        if special:
            pending.append({**special, "metadata": {**special["metadata"], "name": EXTENDED}})
        if not pending:
            return {}
        try:
            statuses = allocate_together(self.api, pending, self.node_name, pod)
        except AllocationError as e:
            raise Unschedulable(f"0/1 nodes are available: 1 cannot allocate all claims ({e})") from None
        return {c["metadata"]["name"]: s["allocation"] for c, s in zip(pending, statuses, strict=True)}

    def _extended_claim(self, pod: JSON) -> tuple[JSON, list[JSON]] | None:
        """The special claim the pod's DRA-backed extended resources need on this node, and the
        pod's requestMappings; None when it asks for none. Unschedulable when one cannot be had."""
        wanted = extended.pod_requests(pod)
        if not wanted:
            return None
        mapping = extended.device_class_mapping(list_all(self.resource.list_device_class))
        allocatable = (self._node().get("status") or {}).get("allocatable") or {}
        by_dra = []
        for name in sorted(wanted):
            if name in mapping and not parse_quantity(allocatable.get(name, 0)):
                by_dra.append(name)  # the node has no device plugin for it: DRA provides it
            elif name not in allocatable:
                raise Unschedulable(f"0/1 nodes are available: 1 Insufficient {name}.")
        if not by_dra:
            return None  # a device plugin's: the kubelet's business, not DRA's
        claims = list_all(self.resource.list_namespaced_resource_claim, namespace=pod["metadata"]["namespace"])
        stale = extended.find_claim(pod, claims)
        if stale is not None:  # left by an attempt that did not bind: start again without it
            self._delete_claim(stale)
            raise Unschedulable(f'deleted extended resource claim "{stale["metadata"]["name"]}" '
                                f"of an earlier scheduling attempt")
        requests, mappings = extended.requests_and_mappings(pod, by_dra, mapping)
        return extended.claim_body(pod, requests), mappings

    def _node(self) -> JSON:
        return json_body(self.core.read_node(self.node_name, _preload_content=False))

    def _delete_claim(self, claim: JSON) -> None:
        """deleteClaim: drop the scheduler's finalizer, then delete."""
        meta = claim["metadata"]
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        try:
            if finalizers != (meta.get("finalizers") or []):
                self.resource.patch_namespaced_resource_claim(meta["name"], meta["namespace"], plain(
                    {"metadata": {"finalizers": finalizers or None, "resourceVersion": meta["resourceVersion"]}}))
            self.resource.delete_namespaced_resource_claim(meta["name"], meta["namespace"])
        except ApiException as e:
            if e.status != 404:
                raise

    def _claim(self, namespace: str, name: str) -> JSON:
        try:
            return json_body(self.resource.read_namespaced_resource_claim(name, namespace, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                raise Unschedulable(f'resourceclaim "{name}" not found') from None
            raise

    def _unreserve(self, pod: JSON, done: list[tuple[str, bool]], created: str = "") -> None:
        """Take back what this attempt wrote: the pod's reservation, allocations it made, and the
        extended resource claim it created (deleted)."""
        if created:
            done = [d for d in done if d[0] != created]
            self._delete_claim(self._claim(pod["metadata"]["namespace"], created))
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
