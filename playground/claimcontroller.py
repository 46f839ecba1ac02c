"""The resourceclaim controller (kube-controller-manager) for the playground.

What it does, after k8s.io/kubernetes pkg/controller/resourceclaim/controller.go:

- a pod claim naming a ResourceClaimTemplate gets its own ResourceClaim: generateName
  `<pod>-<pod claim>-` (both shortened in proportion past 57 characters), owned by the pod
  (controller, blockOwnerDeletion), annotation resource.kubernetes.io/pod-claim-name, the
  template's labels and annotations and spec; the pod's status.resourceClaimStatuses names it;
- reservedFor entries of pods that are gone, replaced or done are dropped; a claim left with
  none is deallocated (allocation cleared, then the scheduler's finalizer
  resource.kubernetes.io/delete-protection removed), so a deleted claim goes away;
- a generated claim no longer reserved whose pod is done is deleted.
"""

from __future__ import annotations

from kubernetes.client import ApiClient, CoreV1Api, ResourceV1Api
from kubernetes.client.exceptions import ApiException

from dra_driver.kube import JSON, api_error, json_body, plain

from .objects import is_done, list_all, pod_event

FINALIZER = "resource.kubernetes.io/delete-protection"  # resourceapi.Finalizer: set by the scheduler
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
COMPONENT = "resource_claim"  # the upstream controller's event source
_MAX_BASE_LEN = 57  # room for the API server's 5 random characters in a 63-character name


def generate_name(pod: str, pod_claim: str) -> str:
    """The generated claim's generateName, shortened as upstream does (the server would cut the end)."""
    name = f"{pod}-{pod_claim}-"
    if len(name) > _MAX_BASE_LEN:
        n = len(name)
        name = pod[:len(pod) * _MAX_BASE_LEN // n] + "-" + pod_claim[:len(pod_claim) * _MAX_BASE_LEN // n]
    return name


def owning_pod(claim: JSON) -> tuple[str, str] | None:
    """(name, uid) of the pod that controls the claim (a generated claim), else None."""
    for owner in claim["metadata"].get("ownerReferences") or []:
        if owner.get("controller") and owner.get("apiVersion") == "v1" and owner.get("kind") == "Pod":
            return owner["name"], owner["uid"]
    return None


class ResourceClaimController:
    def __init__(self, api: ApiClient):
        self.api = api
        self.core = CoreV1Api(api)
        self.resource = ResourceV1Api(api)
        self._reported: set[tuple[str, str]] = set()  # (pod uid, message) already told in an Event

    def sync(self) -> None:
        """One pass over every pod and claim."""
        pods = list_all(self.core.list_pod_for_all_namespaces)
        claims = list_all(self.resource.list_resource_claim_for_all_namespaces)
        for pod in pods:
            if not pod["metadata"].get("deletionTimestamp") and not is_done(pod):
                self._sync_pod(pod, claims)
        by_uid = {p["metadata"]["uid"]: p for p in pods}
        for claim in claims:
            self._sync_claim(claim, by_uid)

    # ---- pods: claims from templates ---------------------------------------------------------

    def _sync_pod(self, pod: JSON, claims: list[JSON]) -> None:
        meta = pod["metadata"]
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        known = {s["name"] for s in statuses}
        added = False
        for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or []:
            template = pod_claim.get("resourceClaimTemplateName")
            if not template or pod_claim["name"] in known:
                continue
            try:
                name = self._find_generated(pod, pod_claim["name"], claims) or \
                    self._generate(pod, pod_claim["name"], template)
            except ApiException as e:
                self._warn_once(pod, "FailedResourceClaimCreation",
                                f"PodResourceClaim {pod_claim['name']}: {_why(e, template)}")
                continue
            statuses.append({"name": pod_claim["name"], "resourceClaimName": name})
            added = True
        if added:
            # A merge patch replaces the list whole: every entry is in it.
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"],
                                                  plain({"status": {"resourceClaimStatuses": statuses}}))

    @staticmethod
    def _find_generated(pod: JSON, pod_claim: str, claims: list[JSON]) -> str | None:
        """A claim generated for this pod claim whose name never reached the pod's status."""
        for claim in claims:
            owner = owning_pod(claim)
            if owner and owner[1] == pod["metadata"]["uid"] and \
                    (claim["metadata"].get("annotations") or {}).get(POD_CLAIM_ANNOTATION) == pod_claim:
                return str(claim["metadata"]["name"])
        return None

    def _generate(self, pod: JSON, pod_claim: str, template_name: str) -> str:
        meta = pod["metadata"]
        template = json_body(self.resource.read_namespaced_resource_claim_template(
            template_name, meta["namespace"], _preload_content=False))
        template_meta = (template.get("spec") or {}).get("metadata") or {}
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {
            "generateName": generate_name(meta["name"], pod_claim),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}],
            "annotations": {**(template_meta.get("annotations") or {}), POD_CLAIM_ANNOTATION: pod_claim},
            **({"labels": template_meta["labels"]} if template_meta.get("labels") else {})},
            "spec": template["spec"]["spec"]}
        created = json_body(self.resource.create_namespaced_resource_claim(meta["namespace"], plain(body),
                                                                           _preload_content=False))
        return str(created["metadata"]["name"])

    def _warn_once(self, pod: JSON, reason: str, message: str) -> None:
        key = (pod["metadata"]["uid"], message)
        if key not in self._reported:
            self._reported.add(key)
            pod_event(self.api, pod, "Warning", reason, message, COMPONENT)

    # ---- claims: reservations, deallocation, generated claims ------------------------------

    def _sync_claim(self, claim: JSON, pods: dict[str, JSON]) -> None:
        meta = claim["metadata"]
        status = claim.get("status") or {}
        reserved = status.get("reservedFor") or []
        valid = [r for r in reserved if r.get("resource") == "pods" and not r.get("apiGroup")
                 and r.get("uid") in pods and not is_done(pods[r["uid"]])]
        finalized = FINALIZER in (meta.get("finalizers") or [])
        if len(valid) < len(reserved) or (finalized and meta.get("deletionTimestamp") and not valid):
            new_status = {**status, "reservedFor": valid}
            if not valid and finalized:  # the last consumer went: deallocate
                new_status.pop("allocation", None)
            if not new_status["reservedFor"]:
                new_status.pop("reservedFor")
            claim = json_body(self.resource.replace_namespaced_resource_claim_status(
                meta["name"], meta["namespace"], plain({**claim, "status": new_status}), _preload_content=False))
            meta = claim["metadata"]
            if finalized and not (claim.get("status") or {}).get("allocation"):
                finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
                claim = json_body(self.resource.replace_namespaced_resource_claim(
                    meta["name"], meta["namespace"], plain({**claim, "metadata": {**meta, "finalizers": finalizers}}),
                    _preload_content=False))
        owner = owning_pod(claim)
        if not valid and owner and not claim["metadata"].get("deletionTimestamp"):
            pod = pods.get(owner[1])
            if pod is not None and is_done(pod):  # its pod will never run again: delete the claim
                self.resource.delete_namespaced_resource_claim(meta["name"], meta["namespace"])


def _why(e: ApiException, template: str) -> str:
    if e.status == 404:
        return f'resource claim template "{template}": resourceclaimtemplate.resource.k8s.io "{template}" not found'
    return api_error(e)
