"""The kubelet's pod lifecycle on the playground's node: run bound pods, prepare and unprepare
their claims through the real kubelet plugin, report status, serve logs.

For each pod bound to the node (spec.nodeName), as the kubelet's DRA manager and pod workers do
(k8s.io/kubernetes pkg/kubelet/cm/dra/manager.go):

- once every claim of the pod is allocated and reserved for it: NodePrepareResources for them
  (a claim already prepared for another pod is not prepared again); an error is one
  FailedPrepareDynamicResources Event and the pod waits (tried again next pass);
- each container runs its command and args with the CDI devices of the claims it names
  (`resources.claims`, a `request` narrowing to that request's devices), and of the requests
  status.extendedResourceClaimStatus maps to its extended resources (the scheduler's claim
  for them, prepared like the others), on the node's runner;
  its output goes to `<workdir>/pods/<namespace>_<pod>_<uid>/<container>/0.log` (the kubelet's
  /var/log/pods layout), which `kubectl logs` reads;
- status: Running with a running containerStatus each, then, when all containers ended,
  Succeeded (all exited 0) or Failed; Events Started and Failed; each container's
  allocatedResourcesStatus from the plugin's health stream, reported again when the health of
  one of the pod's devices changes (devicehealth.py);
- a pod that ended or was deleted: its containers stopped, and NodeUnprepareResources for each
  claim no other pod on the node still uses.

Not done: restarts (restartPolicy is read as Never), images (a container runs its `command` on
the node's runner: no image, so a container without `command` fails), probes, env from the pod.
"""

from __future__ import annotations

import datetime
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes.client import ApiClient, CoreV1Api, ResourceV1Api
from kubernetes.client.exceptions import ApiException

from dra_driver.kube import JSON, json_body, plain
from dra_driver.log import get_logger
from kubeletplugin.claimref import ClaimRef
from playground import extended

from .claims import DRIVER
from .containers import Workload
from .devicehealth import HealthInfoCache, HealthWatch, PreparedDevice, advertises_health, allocated_resources_status
from .node import SimulatedNode
from .objects import list_all, pod_claim_names, pod_event

COMPONENT = "kubelet"
EXTENDED_CLAIM = "<extended-resources>"  # the key of the pod's extended resource claim (not a pod claim name)
log = get_logger("playground.kubelet")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Container:
    name: str
    image: str
    runtime: str  # the runner's kind, for containerID
    log: str
    workload: Workload | None  # None: it could not start
    started_at: str
    exit_code: int | None = None
    finished_at: str = ""
    message: str = ""  # why it could not start

    def status(self) -> JSON:
        if self.workload is not None and self.exit_code is None:
            state: JSON = {"running": {"startedAt": self.started_at}}
        elif self.workload is None:
            state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": self.message,
                                    "startedAt": self.started_at, "finishedAt": self.finished_at}}
        else:
            reason = "Completed" if self.exit_code == 0 else "Error"
            state = {"terminated": {"exitCode": self.exit_code, "reason": reason,
                                    "startedAt": self.started_at, "finishedAt": self.finished_at}}
        running = "running" in state
        return {"name": self.name, "image": self.image, "imageID": "", "ready": running, "started": running,
                "restartCount": 0, "state": state,
                **({"containerID": f"{self.runtime}://{self.workload.proc.pid}"} if self.workload else {})}


@dataclass
class PodRun:
    """A pod this node started: its claims and containers."""

    namespace: str
    name: str
    uid: str
    claims: list[ClaimRef]
    devices: dict[str, list[PreparedDevice]]  # by pod claim name
    containers: dict[str, Container] = field(default_factory=dict)
    started_at: str = ""
    finished: bool = False


class PodSync:
    def __init__(self, api: ApiClient, node: SimulatedNode):
        self.api = api
        self.node = node
        self.core = CoreV1Api(api)
        self.resource = ResourceV1Api(api)
        self.pods: dict[str, PodRun] = {}  # by pod uid
        self.prepared: dict[str, set[str]] = {}  # claim uid -> uids of the pods using it here
        self._reported: set[tuple[str, str]] = set()  # (pod uid, message) told in an Event
        self.health = HealthInfoCache()
        self._health_lock = threading.Lock()
        self._health_changed: set[str] = set()  # uids of pods to report again
        assert node.plugin is not None and node.kubelet is not None, "the plugin is not started"
        # As the real kubelet: a stream only to a plugin whose registration names a health service.
        self._health_watch = (HealthWatch(node.plugin.dra_socket, DRIVER, self.health, self._on_health_change)
                              if advertises_health(node.kubelet.get_info().supported_versions) else None)

    # ---- the loop ----------------------------------------------------------------------------

    def sync(self) -> None:
        pods = list_all(self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={self.node.name}")
        current = {p["metadata"]["uid"]: p for p in pods}
        for uid in [u for u in self.pods if u not in current]:
            self._stop(self.pods.pop(uid))
        for uid, pod in current.items():
            run = self.pods.get(uid)
            if run is None:
                if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    self._start(pod)
            elif not run.finished:
                self._watch(pod, run)

    def close(self) -> None:
        if self._health_watch is not None:
            self._health_watch.close()
        for run in list(self.pods.values()):
            self._stop(run)
        self.pods.clear()

    def _on_health_change(self, changed: set[tuple[str, str, str]]) -> None:
        """The pods holding a device whose health changed are reported again (next pass)."""
        uids = {run.uid for run in list(self.pods.values())
                if any((d.driver, d.pool, d.device) in changed for ds in run.devices.values() for d in ds)}
        with self._health_lock:
            self._health_changed |= uids

    # ---- starting ----------------------------------------------------------------------------

    def _start(self, pod: JSON) -> None:
        meta = pod["metadata"]
        claims = self._ready_claims(pod)
        if claims is None:
            return
        refs = [ClaimRef(meta["namespace"], c["metadata"]["name"], c["metadata"]["uid"]) for c in claims.values()]
        devices = self._prepare(pod, refs)
        if devices is None:
            return
        by_pod_claim = {pod_claim: devices[c["metadata"]["uid"]] for pod_claim, c in claims.items()}
        run = PodRun(meta["namespace"], meta["name"], meta["uid"], refs,
                     {pod_claim: [d for _, d in ds] for pod_claim, ds in by_pod_claim.items()}, started_at=_now())
        self.pods[meta["uid"]] = run
        for ref in refs:
            self.prepared.setdefault(ref.uid, set()).add(meta["uid"])
        for spec in (pod.get("spec") or {}).get("containers") or []:
            run.containers[spec["name"]] = self._start_container(pod, spec, by_pod_claim)
        self._report(pod, run)

    def _ready_claims(self, pod: JSON) -> dict[str, JSON] | None:
        """{pod claim name: ResourceClaim} once each is allocated and reserved for the pod, else None."""
        claims = {}
        names = pod_claim_names(pod)
        special = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
        if special:  # written by the scheduler before it bound the pod
            names[EXTENDED_CLAIM] = special
        for pod_claim, name in names.items():
            if name is None:
                return None
            try:
                claim = json_body(self.resource.read_namespaced_resource_claim(
                    name, pod["metadata"]["namespace"], _preload_content=False))
            except ApiException as e:
                if e.status == 404:
                    return None
                raise
            status = claim.get("status") or {}
            if not status.get("allocation") or \
                    pod["metadata"]["uid"] not in {r.get("uid") for r in status.get("reservedFor") or []}:
                return None
            claims[pod_claim] = claim
        return claims

    def _prepare(self, pod: JSON, refs: list[ClaimRef]) -> dict[str, list[tuple[list[str], PreparedDevice]]] | None:
        """NodePrepareResources: {claim uid: [(request names, device)]}, or None after an Event."""
        if not refs:
            return {}
        assert self.node.kubelet is not None, "the plugin is not started"
        answers = self.node.kubelet.prepare(*refs).claims
        failed = [ref for ref in refs if answers[ref.uid].error]
        if failed:
            ref = failed[0]
            self._warn_once(pod, "FailedPrepareDynamicResources",
                            f"Failed to prepare dynamic resources: prepare dynamic resources: "
                            f"NodePrepareResources failed for ResourceClaim {ref.name}: {answers[ref.uid].error}")
            # The pod does not start: take back what was prepared for it alone.
            self._unprepare([r for r in refs if r not in failed and r.uid not in self.prepared])
            return None
        return {ref.uid: [(list(d.request_names),
                           PreparedDevice(DRIVER, d.pool_name, d.device_name, tuple(d.cdi_device_ids)))
                          for d in answers[ref.uid].devices]
                for ref in refs}

    def _start_container(self, pod: JSON, spec: JSON, devices: dict[str, list[tuple[list[str], PreparedDevice]]]
                         ) -> Container:
        meta = pod["metadata"]
        name = spec["name"]
        ids = [i for used in (spec.get("resources") or {}).get("claims") or []
               for requests, device in devices.get(used["name"], [])
               if not used.get("request") or used["request"] in requests for i in device.cdi_device_ids]
        mapped = set(extended.container_request_names(pod, spec))
        ids += [i for requests, device in devices.get(EXTENDED_CLAIM, []) if mapped & set(requests)
                for i in device.cdi_device_ids]
        log_path = os.path.join(self.node.workdir, "pods", f"{meta['namespace']}_{meta['name']}_{meta['uid']}",
                                name, "0.log")
        container = Container(name, spec.get("image", ""), self.node.runner.kind, log_path, None, _now())
        argv = [*(spec.get("command") or []), *(spec.get("args") or [])]
        if not spec.get("command"):
            container.message = (f"the playground runs no images: container {name} needs a command "
                                 f"(image {spec.get('image')!r} is not pulled)")
        else:
            try:
                container.workload = self.node.runner.start_command(f"{meta['name']}-{name}", ids, argv, log=log_path)
            except OSError as e:  # the command is not on the node
                container.message = f"failed to start container {name}: {e}"
        if container.workload is None:
            container.finished_at = _now()
            pod_event(self.api, pod, "Warning", "Failed", f"Error: {container.message}", COMPONENT, self.node.name)
        else:
            pod_event(self.api, pod, "Normal", "Started", f"Started container {name}", COMPONENT, self.node.name)
        return container

    # ---- running and ending ------------------------------------------------------------------

    def _watch(self, pod: JSON, run: PodRun) -> None:
        with self._health_lock:
            changed = run.uid in self._health_changed
            self._health_changed.discard(run.uid)
        for c in run.containers.values():
            if c.workload is not None and c.exit_code is None and not c.workload.running():
                c.exit_code, c.finished_at, changed = c.workload.proc.returncode, _now(), True
        if changed:
            self._report(pod, run)

    def _report(self, pod: JSON, run: PodRun) -> None:
        """The pod's status from its containers'; a pod whose containers all ended is done."""
        specs = {c["name"]: c for c in (pod.get("spec") or {}).get("containers") or []}
        statuses = []
        for c in run.containers.values():
            container_status = c.status()
            health = allocated_resources_status(specs.get(c.name, {}), run.devices, self.health)
            statuses.append({**container_status, "allocatedResourcesStatus": health} if health else container_status)
        ended = [c for c in run.containers.values() if c.workload is None or c.exit_code is not None]
        if len(ended) == len(run.containers):
            phase = "Succeeded" if all(c.workload is not None and c.exit_code == 0 for c in ended) else "Failed"
        else:
            phase = "Running"
        ready = "True" if phase == "Running" and not ended else "False"
        now = _now()
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"]
        conditions += [{"type": t, "status": s, "lastTransitionTime": now}
                       for t, s in (("Initialized", "True"), ("ContainersReady", ready), ("Ready", ready))]
        status = {"phase": phase, "hostIP": "127.0.0.1", "startTime": run.started_at, "conditions": conditions,
                  "containerStatuses": statuses}
        self.core.patch_namespaced_pod_status(run.name, run.namespace, plain({"status": status}))
        if phase != "Running":
            self._stop(run)

    def _stop(self, run: PodRun) -> None:
        """Stop the pod's containers and unprepare the claims no other pod here uses (once)."""
        if run.finished:
            return
        for c in run.containers.values():
            if c.workload is not None and c.workload.running():
                c.workload.stop()
        run.finished = True
        unused = []
        for ref in run.claims:
            users = self.prepared.get(ref.uid, set())
            users.discard(run.uid)
            if not users:
                self.prepared.pop(ref.uid, None)
                unused.append(ref)
        self._unprepare(unused)

    def _unprepare(self, refs: list[ClaimRef]) -> None:
        if not refs or self.node.kubelet is None:
            return
        answers = self.node.kubelet.unprepare(*refs).claims
        for ref in refs:
            if answers[ref.uid].error:
                log.warning("unprepare failed", claim=f"{ref.namespace}/{ref.name}", error=answers[ref.uid].error)

    def _warn_once(self, pod: JSON, reason: str, message: str) -> None:
        key = (pod["metadata"]["uid"], message)
        if key not in self._reported:
            self._reported.add(key)
            pod_event(self.api, pod, "Warning", reason, message, COMPONENT, self.node.name)

    # ---- kubectl logs ------------------------------------------------------------------------

    def logs(self, namespace: str, pod: str, container: str) -> str | None:
        """A container's output so far (ApiEmulator.pod_logs); None when it has not started here."""
        for run in list(self.pods.values()):  # called from the API server's threads
            if (run.namespace, run.name) == (namespace, pod) and container in run.containers:
                path = Path(run.containers[container].log)
                return path.read_text(errors="replace") if path.exists() else ""
        return None
