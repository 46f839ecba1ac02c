"""ResourceClaim.status.devices: what each prepared claim got on this node.

Prepare and Unprepare only queue the change; a thread writes it by server-side apply of the
status subresource, with the driver's name as field manager: the list is a map keyed by
driver, pool, device and shareID, so each driver owns its own entries; applying this node's
entries of a claim replaces the ones it applied before, and applying none removes them. (A
strategic merge patch cannot share the list: it has no patch strategy, so kube-apiserver
replaces it whole, and a `$patch: delete` item was kept as an entry with no data.) A failed
write is retried with backoff and never fails Prepare.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from dra_driver.kube import BACKGROUND_API_TIMEOUT_S, api_deadline, api_error
from dra_driver.log import get_logger
from kubeletplugin.prepared import PreparedClaim

from .shares import Share, kernel_loss, slot_loss

log = get_logger("agent.status")

APPLY_PATCH = "application/apply-patch+yaml"
RETRY_S = (1, 2, 5, 10, 30)


Entries = list[dict[str, Any]]  # this driver's status.devices entries of one claim


Condition = dict[str, str]  # a metav1.Condition of a device entry
# The condition type: whether the claim gets its compute share on the entry's GPU.
SHARE_HELD = "ComputeShareHeld"
TOO_LONG = "KernelsTooLong"


def kernels_too_long(share: Share, transition: str) -> Condition:
    """The condition of a busy claim whose slot loses more than MAX_SLOT_LOSS of the GPU after its
    last whole kernel, at the longest period (plan_gpu found none that holds it). transition:
    when it became so (RFC 3339)."""
    loss_ms = slot_loss(share.length_us, share.kernel_us) / 1000
    return {"type": SHARE_HELD, "status": "False", "reason": TOO_LONG, "lastTransitionTime": transition,
            "message": f"its longest kernels ({share.kernel_us / 1000:.1f} ms) leave {loss_ms:.1f} ms of its "
                       f"{share.length_us / 1000:.1f} ms slot in each {share.period_us // 1000} ms period unused: "
                       f"it gets about {100 * kernel_loss(share):.1f} % of the GPU less than its share of "
                       f"{100 * share.limit:.0f} %. Shorter kernels, or a share that holds whole kernels, "
                       "get all of it (docs/compute.md, 'The period follows the longest kernels')"}


def oversubscribed(share: Share, total: float, transition: str) -> Condition:
    """The condition of a claim on a GPU whose paced claims' compute limits sum to `total` > 1
    (prepared past the allocator): plan_gpu gives each its limit over the sum."""
    return {"type": SHARE_HELD, "status": "False", "reason": "GpuOversubscribed", "lastTransitionTime": transition,
            "message": f"the compute limits of the paced claims on its GPU sum to {100 * total:.0f} %: each gets "
                       f"its limit divided by that, this claim {100 * share.limit / total:.1f} % for its "
                       f"{100 * share.limit:.0f} % (claims prepared past the scheduler's allocation)"}


def device_entries(driver: str, claim: PreparedClaim, conditions: Mapping[int, Condition] | None = None) -> Entries:
    """One status entry per prepared device, with the limits of its GPU in `data`, and the
    condition of its GPU (by host index) where `conditions` has one."""
    entries = []
    for d in claim.devices:
        gpu = claim.gpu_of(d)
        entry: dict[str, Any] = {
            "driver": driver, "pool": d.pool_name, "device": d.device_name,
            "data": {"uuid": gpu.uuid, "memoryLimit": str(gpu.memory_limit), "computeLimit": gpu.compute_limit,
                     "computePolicy": gpu.compute_policy, "sharingStrategy": claim.sharing_strategy,
                     "priority": claim.priority}}
        if d.share_id:
            entry["shareID"] = d.share_id
        if conditions and gpu.index in conditions:
            entry["conditions"] = [conditions[gpu.index]]
        entries.append(entry)
    return entries


class StatusWriter:
    def __init__(self, api: client.ApiClient, driver: str) -> None:
        self.resource_api = client.ResourceV1Api(api)
        self.driver = driver
        self._pending: dict[str, tuple[str, str, Entries, int, float]] = {}  # uid -> ns, name, entries, tries, due
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="agent-status", daemon=True)

    @property
    def pending(self) -> int:
        """Claims whose last change is not written yet (retries included)."""
        with self._cond:
            return len(self._pending)

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> StatusWriter:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self.started:
            self._thread.join(timeout=5)

    def prepared(self, claim: PreparedClaim, conditions: Mapping[int, Condition] | None = None) -> None:
        """Write the claim's entries; with `conditions` (host GPU index -> condition) on its
        devices of those GPUs, and none on the others (applying without one removes it)."""
        self._queue(claim, device_entries(self.driver, claim, conditions))

    def unprepared(self, claim: PreparedClaim) -> None:
        self._queue(claim, [])  # applying none removes what this driver applied

    def _queue(self, claim: PreparedClaim, entries: Entries) -> None:
        with self._cond:  # a newer change of the same claim replaces an unwritten older one
            self._pending[claim.uid] = (claim.namespace, claim.name, entries, 0, 0.0)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._due():
                    due = min((p[4] for p in self._pending.values()), default=None)
                    self._cond.wait(None if due is None else max(0.0, due - time.monotonic()))
                if self._stop:
                    return
                uid, (ns, name, entries, tries, _) = next((u, p) for u, p in self._pending.items()
                                                        if p[4] <= time.monotonic())
            ok = self._write(ns, name, uid, entries)
            with self._cond:
                pending = self._pending.get(uid)
                if pending is not None and pending[2] is entries:  # not replaced meanwhile
                    if ok:
                        del self._pending[uid]
                    else:
                        delay = RETRY_S[min(tries, len(RETRY_S) - 1)]
                        self._pending[uid] = (ns, name, entries, tries + 1, time.monotonic() + delay)

    def _due(self) -> bool:
        now = time.monotonic()
        return any(p[4] <= now for p in self._pending.values())

    def _write(self, ns: str, name: str, uid: str, entries: Entries) -> bool:
        """True when done: written, or nothing to write to (the claim is gone, recreated, or no
        longer allocated these devices: the API server refuses the entries as invalid)."""
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": ns, "uid": uid},  # uid: never a recreated claim
                "status": {"devices": entries}}
        try:
            with api_deadline(BACKGROUND_API_TIMEOUT_S):
                resp: Any = self.resource_api.patch_namespaced_resource_claim_status(
                    name, ns, body, field_manager=self.driver, force=True, _content_type=APPLY_PATCH,
                    _request_timeout=BACKGROUND_API_TIMEOUT_S, _preload_content=False)
                resp.drain_conn()  # read to its end, never parsed: parsing cost more than the call
            log.debug("claim status written", claim=f"{ns}/{name}", uid=uid)
            return True
        except client.ApiException as e:
            if e.status == 404:
                return True  # the claim is gone
            if e.status == 422:  # recreated (its uid), or deallocated meanwhile (the devices): retrying cannot help
                if entries:
                    log.warning("claim status refused; not retried", claim=f"{ns}/{name}", uid=uid,
                                error=api_error(e))
                return True
            log.warning("writing claim status failed; will retry", claim=f"{ns}/{name}", uid=uid,
                        error=api_error(e))
        except Exception as e:  # connection refused, timeouts
            log.warning("writing claim status failed; will retry", claim=f"{ns}/{name}", uid=uid, error=str(e))
        return False
