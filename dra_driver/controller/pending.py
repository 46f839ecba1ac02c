"""A Warning Event on each ResourceClaim that no GPU can hold now.

A claim that fits a GPU's size but no GPU's free capacity stays unallocated; the scheduler says
only "cannot allocate all claims", on the pod. Every PERIOD_S this looks at the claims of the
driver's classes that are not allocated (and older than GRACE_S, so the scheduler had its try),
works out with `gpushare-dra explain`'s logic (dra_driver/explain.py) what each GPU has free, and
when no GPU fits, records `NoGpuFits` on the claim, naming the GPUs with their free memory and
compute. Again only when that changes (a GPU freed some, another claim took some).

One writer per cluster: the controller of the node whose slice sorts first by name among the
driver's slices (the API server lists in name order), so N nodes do not record N Events. Its
cost: that node lists the driver's slices and every claim each PERIOD_S; every other node asks
for the first slice only (limit=1) every OTHERS_PERIOD_S, to notice that it became the writer.
(It used to list every slice for that: with 1,000 nodes, 1,000 lists of the whole fleet's slices
every 5 minutes, and all of them 10 s after the controllers started; docs/fleet.md.) These are
the only requests of a controller besides its watch while nothing changes (docs/controller.md).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable

from kubernetes import client

from ..explain import verdicts
from ..kube import JSON, api_error, json_body, plain, warning_event
from ..log import get_logger

REASON = "NoGpuFits"
PERIOD_S = 10.0
OTHERS_PERIOD_S = 60.0  # how long Events may pause when the writer's node goes (its slices with it)
GRACE_S = 5.0
REQUEST_TIMEOUT = (5, 30)
MESSAGE_MAX = 1024  # what an Event's message may hold

log = get_logger("gpushare.controller")


def ours(claim: JSON, driver: str) -> bool:
    """A request of the claim names one of the driver's classes (gpushare.dev, *.gpushare.dev)."""
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        for ask in [request.get("exactly") or {}, *(request.get("firstAvailable") or [])]:
            name = ask.get("deviceClassName", "")
            if name == driver or name.endswith("." + driver):
                return True
    return False


def message(claim: JSON, slices: list[JSON], claims: list[JSON], driver: str) -> str | None:
    """The Event's message when no GPU fits any request of the claim now, else None."""
    found = verdicts(claim, slices, claims, driver)
    if not found or not any(per_gpu for _, per_gpu in found):
        return None
    if any(verdict == "fits" for _, per_gpu in found for _, verdict in per_gpu):
        return None
    parts = []
    for ask, per_gpu in found:
        gpus = "; ".join(f"{gpu.node} {gpu.name}: {gpu.free()} ({verdict.removeprefix('no: ')})"
                         for gpu, verdict in per_gpu)
        parts.append(f"request '{ask.name}' asks {ask.describe()}; {gpus}")
    text = f"no GPU of {driver} can hold the claim now: " + " | ".join(parts) + \
        " (gpushare-dra explain shows it again)"
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX - 3] + "..."


def _age_s(claim: JSON, now: datetime.datetime) -> float:
    created = claim["metadata"].get("creationTimestamp")
    if not created:
        return 0.0
    when = datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    return (now - when).total_seconds()


class PendingClaims:
    """Records NoGpuFits Events on the claims no GPU can hold, from one node per cluster."""

    def __init__(self, api_client: client.ApiClient, driver: str, node: str, period: float = PERIOD_S,
                 now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)):
        self._resource = client.ResourceV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self.driver, self.node, self.period, self.now = driver, node, period, now
        self._told: dict[str, str] = {}  # claim uid -> the message recorded last
        self._writer: bool | None = None  # whether the last look found this node the writer; None: no look yet
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PendingClaims:
        self._thread = threading.Thread(target=self._run, name="pending-claims", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stopped.wait(OTHERS_PERIOD_S if self._writer is False else self.period):
            try:
                self.pass_once()
            except client.ApiException as e:
                log.warning("looking at unallocated claims failed", error=api_error(e))
            except Exception as e:  # one bad object must not end the loop
                log.warning("looking at unallocated claims failed", error=f"{type(e).__name__}: {e}")

    def pass_once(self) -> int:
        """One look; the number of Events recorded."""
        # The writer lists every slice anyway (it needs them all); the others ask for the first.
        was_writer = self._writer
        slices = self._slices(limit=None if was_writer else 1)
        self._writer = bool(slices) and slices[0]["spec"].get("nodeName") == self.node
        if not self._writer:
            return 0  # another node's controller writes them
        if not was_writer:
            slices = self._slices()
        claims = json_body(self._resource.list_resource_claim_for_all_namespaces(
            _preload_content=False, _request_timeout=REQUEST_TIMEOUT)).get("items") or []
        now, recorded, pending = self.now(), 0, set()
        for claim in claims:
            if (claim.get("status") or {}).get("allocation") or not ours(claim, self.driver):
                continue
            if _age_s(claim, now) < GRACE_S:
                continue
            uid = claim["metadata"]["uid"]
            pending.add(uid)
            text = message(claim, slices, claims, self.driver)
            if text is None or self._told.get(uid) == text:
                continue
            self._record(claim, text)
            self._told[uid] = text
            recorded += 1
        self._told = {uid: text for uid, text in self._told.items() if uid in pending}
        return recorded

    def _slices(self, limit: int | None = None) -> list[JSON]:
        """The driver's slices in name order: all, or the first `limit`."""
        return json_body(self._resource.list_resource_slice(
            field_selector=f"spec.driver={self.driver}", limit=limit, _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT)).get("items") or []

    def _record(self, claim: JSON, text: str) -> None:
        meta = claim["metadata"]
        involved = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": meta["name"],
                    "namespace": meta["namespace"], "uid": meta["uid"]}
        event = warning_event(involved, REASON, text, namespace=meta["namespace"], component="gpushare-dra-controller",
                              reporting_component=self.driver, host=self.node)
        self._core.create_namespaced_event(meta["namespace"], plain(event), _preload_content=False,
                                           _request_timeout=REQUEST_TIMEOUT)
        log.info("no GPU can hold a claim now", claim=f"{meta['namespace']}/{meta['name']}", reason=REASON)
