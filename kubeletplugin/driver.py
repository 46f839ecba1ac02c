"""Prepare and unprepare claims: the one place that changes claim state on this node.

A claim's life, each step recorded before the next starts (fault points in faults.py):

    Prepare:   checkpoint PrepareStarted -> strategies acquire (MIG instances) -> claim files
               -> strategies apply (MPS limits) -> CDI spec -> checkpoint PrepareCompleted
    Unprepare: checkpoint UnprepareStarted -> remove CDI spec -> remove claim files
               -> strategies release (MIG instances) -> drop entry -> strategies apply (MPS limits)

The sharing strategies (kubeletplugin/strategies/: time slicing, MPS, MIG) are called through one
interface at those steps and at start-up; what they make has records of their own (the MIG
ledger), recovered after the claims.

At start-up (`recover`) anything not PrepareCompleted is rolled back, completed claims get
missing files or specs rewritten (a reboot empties /var/run/cdi), CDI specs that no entry owns
are removed when this plugin wrote them (they mount its claims folder; another plugin's in a
shared CDI root are left alone), and a claim folder no entry owns is adopted from its prepared.json (kept, never
removed because the checkpoint lacks it). So after any crash a claim is prepared exactly once or absent, and
the kubelet's retry finishes the job.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client

from cdi import find_devices_of_kind, remove_temp_files
from dra_driver.config.strategies import GPU_MPS, STRATEGY_ATTRIBUTE, GpuStrategies, gpu_serves
from dra_driver.devicemodel import parse_device_name
from dra_driver.discovery import DeviceBackend, GpuInfo
from dra_driver.install import LIBRARY_NAME, prune_versions
from dra_driver.kube import (
    API_BODY_MAX,
    BACKGROUND_API_TIMEOUT_S,
    ApiDeadlineExceeded,
    api_deadline,
    api_error,
    no_request_retries,
    plain,
    read_body,
    warning_event,
)
from dra_driver.log import get_logger
from dra_driver.mig import MigInstances, MigProfile

from . import checkpoint as ckpt
from .allocation import plan_claim, unmet_capacity
from .cdispec import SimDriver, build_spec, written_by
from .claimfiles import CONTAINER_LIBRARY
from .claimref import UID, ClaimError, ClaimRef, check_ref, check_uid
from .faults import NO_FAULTS, Faults, reaches
from .nodestate import NodeState
from .prepared import PreparedClaim, PreparedDevice, PreparedError, PreparedGpu
from .strategies import Strategy, StrategyError
from .strategies.mig.ledger import MigState
from .strategies.mig.strategy import Mig
from .strategies.mps.control import MpsControl
from .strategies.mps.strategy import Mps
from .strategies.timeslicing import TimeSlicing

log = get_logger("kubeletplugin.driver")

NVIDIA_KIND = "nvidia.com/gpu"
API_TIMEOUT_S = 20  # reading a claim, the whole exchange; the kubelet gives a whole Prepare call 45 s
CLAIM_LOCK_WAIT_S = 5.0  # a call waits this long for another call of the same claim (~10 ms normally)
CAPACITY_EVENT_REASON = "CapacityRequestDropped"


class KeyedLocks:
    """One lock per key, dropped when nobody holds or waits for it. A wait is bounded: calls
    queued behind a slow call of one claim give their gRPC worker back instead of piling up
    until no worker is left for other claims (or the health check)."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            if not lock.acquire(timeout=self.wait_s):
                raise ClaimError(f"claim {key}: another call for this claim is still running after {self.wait_s:g} s; "
                                 "the kubelet retries", reason="busy")
            try:
                yield
            finally:
                lock.release()
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


class ClaimListener(Protocol):
    """Told of every completed Prepare and Unprepare (the node agent: claim status, its claims)."""

    def claim_prepared(self, claim: PreparedClaim) -> None: ...

    def claim_unprepared(self, claim: PreparedClaim) -> None: ...


class Driver:
    def __init__(self, api: client.ApiClient, driver_name: str, node_name: str, backend: DeviceBackend,
                 partitions: int, host_library: str, node: NodeState, mps: MpsControl,
                 gpu_strategies: GpuStrategies | None = None, sim: SimDriver | None = None,
                 faults: Faults = NO_FAULTS, mig: MigInstances | None = None) -> None:
        """Everything it works with is built by the caller (main.py): `node` is the node's state
        (claims' folders, CDI specs, checkpoint, call lock), `sim` the simulated driver that mock
        GPUs' containers get."""
        no_request_retries(api)  # one read of a claim within API_TIMEOUT_S, not four; api_deadline bounds it
        self.resource_api = client.ResourceV1Api(api)
        self.core_api = client.CoreV1Api(api)
        self.driver_name = driver_name
        self.node_name = node_name
        self.backend = backend
        self.partitions = partitions
        self.host_library = host_library
        self.sim = sim
        self.state_dir = node.state_dir
        self.files = node.files
        self.specs = node.specs
        self.cdi_dirs = list(node.cdi_dirs)
        self.checkpoint = node.checkpoint
        self.calls = node.calls  # another plugin instance may share the state dir (a rolling upgrade): calls take turns
        self.mps = mps
        self.gpu_strategies = gpu_strategies or GpuStrategies()  # what each GPU serves (its sharingStrategy attribute)
        self._locks = KeyedLocks(CLAIM_LOCK_WAIT_S)
        self._gpus: dict[int, GpuInfo] = {}
        self._gpus_lock = threading.Lock()
        self.faults = faults  # the fault points its steps reach (faults.reaches)
        # MIG instances made for claims (None: --mig-gpus names no GPU)
        mig_state = MigState(mig, self.state_dir, self._mig_profiles, faults.reached) if mig else None
        # called in this order at every step of a claim's life (strategies/__init__.py)
        self.strategies: tuple[Strategy, ...] = (TimeSlicing(), Mps(mps),
                                                 Mig(mig_state, capability_nodes=backend.name == "nvml"))
        self.listeners: list[ClaimListener] = []  # a listener's failure never fails a call
        self.on_error: Callable[[str, str], None] = lambda operation, reason: None  # metrics: failed calls by reason

    def close(self) -> None:
        """Compact the checkpoint (the next instance may be an older release, which reads only the
        file, not its journal), then close the lock files."""
        if self.calls.closed:  # stopped before
            return
        try:
            with self.calls.hold():
                self.checkpoint.compact()
        except Exception as e:  # the journal keeps every change; only an older release misses it
            log.error("compacting the checkpoint at shutdown", path=self.checkpoint.path, error=str(e))
        self.calls.close()

    # ---- Prepare ---------------------------------------------------------------------------

    def prepare(self, namespace: str, name: str, uid: str) -> tuple[PreparedDevice, ...]:
        """The Device entries of the claim's answer; ClaimError says why not."""
        with self._reasons("prepare"), self.calls.hold():
            return self._prepare(namespace, name, uid)

    @contextmanager
    def _reasons(self, operation: str) -> Iterator[None]:
        """Count a failed call by reason (the ClaimError's `reason`, set where it is raised)."""
        try:
            yield
        except ClaimError as e:
            self.on_error(operation, e.reason)
            raise
        except Exception:
            self.on_error(operation, "internal")
            raise

    def _tell(self, claim: PreparedClaim | None, prepared: bool) -> None:
        if claim is None:  # unprepared before its Prepare completed: nobody was told of it
            return
        for listener in self.listeners:
            try:
                (listener.claim_prepared if prepared else listener.claim_unprepared)(claim)
            except Exception:
                log.exception("listener failed", prepared=prepared, uid=claim.uid)

    def _prepare(self, namespace: str, name: str, uid: str) -> tuple[PreparedDevice, ...]:
        ref = check_ref(namespace, name, uid)
        with self._locks.hold(uid):
            entry = self.checkpoint.get(uid)
            if entry and entry.state == ckpt.PREPARE_COMPLETED and entry.prepared:
                return self._answer_again(entry.prepared)
            if entry:
                self._remove(uid, "leftover of an interrupted call")
            claim, unmet = self._plan(ref)
            self._record_started(claim)
            with self._rolled_back_on_failure(claim):
                claim = self._acquire(claim)
                self._write_files(claim)
                self._apply(claim, self._prepared_now() | {claim.uid: claim})
                self._write_claim_spec(claim)
                self._record_completed(claim)
            self._announce(claim, unmet)
            return claim.devices

    def _answer_again(self, claim: PreparedClaim) -> tuple[PreparedDevice, ...]:
        """A second pod sharing the claim, or a kubelet restart: same answer, regions untouched."""
        if not self.specs.exists(claim.uid):
            self._write_spec(claim)
        log.debug("claim already prepared", claim=f"{claim.namespace}/{claim.name}", uid=claim.uid, step="prepare")
        return claim.devices

    @reaches("prepare-started-recorded")
    def _record_started(self, claim: PreparedClaim) -> None:
        self.checkpoint.set(claim.uid, ckpt.Entry(ckpt.PREPARE_STARTED, claim.namespace, claim.name, None))

    @contextmanager
    def _rolled_back_on_failure(self, claim: PreparedClaim) -> Iterator[None]:
        """A step that fails leaves nothing of the claim behind; its ClaimError says which."""
        try:
            yield
        except StrategyError as e:
            self._roll_back(claim, e.reason, e.cause)
            raise ClaimError(str(e), reason=e.reason) from None
        except OSError as e:
            self._roll_back(claim, "write", e)
            raise ClaimError(f"writing the claim's files: {e}", reason="io") from None

    def _roll_back(self, claim: PreparedClaim, step: str, error: Exception) -> None:
        log.error("prepare failed, rolling back", claim=f"{claim.namespace}/{claim.name}", uid=claim.uid, step=step,
                  error=str(error))
        self._remove(claim.uid, "rollback of a failed prepare")

    def _acquire(self, claim: PreparedClaim) -> PreparedClaim:
        """The claim with what the strategies made for its devices (MIG instances)."""
        for strategy in self.strategies:
            claim = strategy.acquire(claim)
        return claim

    @reaches("prepare-files-written")
    def _write_files(self, claim: PreparedClaim) -> None:
        self.files.write(claim)

    def _apply(self, claim: PreparedClaim, claims: dict[str, PreparedClaim]) -> None:
        """The strategies learn that `claim` came or went: `claims` are the prepared claims now."""
        for strategy in self.strategies:
            strategy.apply(claim, claims)

    def _prepared_now(self) -> dict[str, PreparedClaim]:
        """Every claim the checkpoint has an answer for, by uid (one being unprepared too)."""
        return {uid: e.prepared for uid, e in self.checkpoint.items() if e.prepared}

    @reaches("prepare-spec-written")
    def _write_claim_spec(self, claim: PreparedClaim) -> None:
        self._write_spec(claim)

    @reaches("prepare-completed-recorded")
    def _record_completed(self, claim: PreparedClaim) -> None:
        self.checkpoint.set(claim.uid, ckpt.Entry(ckpt.PREPARE_COMPLETED, claim.namespace, claim.name, claim))

    def _announce(self, claim: PreparedClaim, unmet: str | None) -> None:
        """Log the prepared claim, tell the listeners, and warn its author of capacity it did not get."""
        log.info("claim prepared", claim=f"{claim.namespace}/{claim.name}", uid=claim.uid, step="prepare",
                 gpus=[f"{g.uuid} memory={g.memory_limit} compute={g.compute_limit}" for g in claim.gpus])
        self._tell(claim, prepared=True)
        if unmet:
            self._warn_author(claim, unmet)

    def _mig_profiles(self, gpu_uuid: str) -> tuple[MigProfile, ...]:
        with self._gpus_lock:
            gpus = list(self._gpus.values()) or self.backend.discover()
        return next((g.mig_profiles for g in gpus if g.uuid == gpu_uuid), ())

    def _plan(self, ref: ClaimRef) -> tuple[PreparedClaim, str | None]:
        """The claim prepared, and what to tell its author about capacity it asked for and did not get."""
        claim = self._read_claim(ref)
        plan = plan_claim(claim, self.driver_name, self.node_name, self._gpus_for(claim), self.partitions)
        for gpu in plan.gpus:  # the scheduler keeps strategies apart by the devices' attribute; a claim that
            served = self.gpu_strategies.of(gpu.index)  # chose MPS through another class is refused here
            if not gpu_serves(served, plan.sharing_strategy):
                raise ClaimError(f"sharingStrategy {plan.sharing_strategy}: GPU {gpu.index} serves "
                                 f"{'MPS claims only' if served == GPU_MPS else 'TimeSlicing and None claims'} "
                                 f"(its devices' attribute {STRATEGY_ATTRIBUTE}={served}, the plugin's --mps-gpus); "
                                 f"ask for MPS with DeviceClass mps.gpushare.dev, for the others with gpushare.dev "
                                 f"(docs/strategies.md, Keeping strategies apart)", reason="strategy")
        mig = any(g.mig for g in plan.gpus)
        if mig and not all(g.mig for g in plan.gpus):  # CUDA_VISIBLE_DEVICES names MIG devices only
            raise ClaimError("status.allocation.devices.results: MIG devices and whole or shared GPUs in one claim "
                             "(a container sees either; use two claims)", reason="mig")
        # the toolkit's spec names whole GPUs; a MIG device's nodes are ours (made after its instance)
        toolkit = {} if mig else find_devices_of_kind(self.cdi_dirs, NVIDIA_KIND, skip_prefix=self.specs.prefix)
        by_key = {g.key: g for g in plan.gpus}
        devices = []
        for device in plan.devices:
            ids = [f"{self.specs.kind}={device.cdi_name(ref.uid)}"]
            gpu = by_key[device.gpu_key]
            for candidate in (gpu.uuid, str(gpu.index), "all"):
                if candidate in toolkit:
                    ids.append(f"{NVIDIA_KIND}={candidate}")
                    break
            devices.append(replace(device, cdi_device_ids=tuple(ids)))
        nodes = () if toolkit or self.backend.name != "nvml" else _nvidia_device_nodes(plan.gpus)
        prepared = PreparedClaim(ref.namespace, ref.name, ref.uid, plan.gpus, tuple(devices), nodes, self.host_library,
                                 plan.sharing_strategy, plan.priority)
        return prepared, unmet_capacity(claim, self.driver_name, self.node_name, plan.gpus)

    def _warn_author(self, claim: PreparedClaim, message: str) -> None:
        """A Warning Event on the claim, where `kubectl describe resourceclaim` shows it; sent from
        a thread of its own, so a slow API server never holds up Prepare. Best effort."""
        log.warning("claim prepared without the capacity it asked for", claim=f"{claim.namespace}/{claim.name}",
                    uid=claim.uid, step="prepare", detail=message)
        involved = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": claim.name,
                    "namespace": claim.namespace, "uid": claim.uid}
        # The Event lives in the claim's namespace: the API server refuses (422) an Event whose
        # namespace differs from its involvedObject's.
        event = warning_event(involved, CAPACITY_EVENT_REASON, message[:1024], namespace=claim.namespace,
                              component="gpushare-dra-kubelet-plugin", reporting_component=self.driver_name,
                              host=self.node_name)

        def send() -> None:
            try:
                with api_deadline(BACKGROUND_API_TIMEOUT_S):
                    resp: Any = self.core_api.create_namespaced_event(
                        claim.namespace, plain(event), _preload_content=False,
                        _request_timeout=BACKGROUND_API_TIMEOUT_S)
                    resp.drain_conn()  # read to its end within the deadline, never parsed
            except Exception as e:
                error = api_error(e) if isinstance(e, client.ApiException) else f"{type(e).__name__}: {e}"
                log.warning("could not record an Event on the claim", claim=f"{claim.namespace}/{claim.name}",
                            reason=CAPACITY_EVENT_REASON, error=error)

        threading.Thread(target=send, name=f"claim-event[{claim.uid[:8]}]", daemon=True).start()

    def _read_claim(self, ref: ClaimRef) -> dict[str, Any]:
        self.faults.delay_prepare(ref.name)
        started = time.monotonic()
        try:
            # Raw JSON: keeps every field (consumedCapacity, shareID) and skips slow model decoding.
            # Bounded as a whole: a hung or trickling API server must not hold a gRPC worker (and
            # the claim's lock) past the kubelet's deadline.
            with api_deadline(API_TIMEOUT_S):
                resp: Any = self.resource_api.read_namespaced_resource_claim(
                    ref.name, ref.namespace, _preload_content=False, _request_timeout=API_TIMEOUT_S)
                claim: dict[str, Any] = json.loads(read_body(resp, API_BODY_MAX))
        except client.ApiException as e:
            if e.status == 404:
                raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name}: not found",
                                 reason="claim_not_found") from None
            raise ClaimError(f"reading ResourceClaim {ref.namespace}/{ref.name}: {api_error(e)}",
                             reason="api_error") from None
        except Exception as e:  # connection refused or reset, no answer in time: the kubelet retries
            server = f"the API server ({self.resource_api.api_client.configuration.host})"
            if isinstance(e, ApiDeadlineExceeded):
                raise ClaimError(f"reading ResourceClaim {ref.namespace}/{ref.name}: {server} did not answer "
                                 f"within {API_TIMEOUT_S:g} s (connecting, sending, the headers and the body "
                                 "together)", reason="api_error") from None
            raise ClaimError(f"reading ResourceClaim {ref.namespace}/{ref.name}: {server}: {e} "
                             f"(after {time.monotonic() - started:.1f} s)", reason="api_error") from None
        got = (claim.get("metadata") or {}).get("uid")
        if got != ref.uid:
            raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name}: metadata.uid is {got!r}, the kubelet asked "
                             f"for {ref.uid!r} (deleted and recreated?)", reason="uid_mismatch")
        return claim

    def _gpus_for(self, claim: dict[str, Any]) -> dict[int, GpuInfo]:
        """This node's GPUs by index, discovered again when the claim names one we have not seen
        (a name that is not ours is refused by plan_claim)."""
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        wanted = {ref.gpu_index for r in results
                  if r.get("driver") == self.driver_name and (ref := parse_device_name(r.get("device")))}
        with self._gpus_lock:
            if not self._gpus or any(w not in self._gpus for w in wanted):
                self._gpus = {g.index: g for g in self.backend.discover()}
            return self._gpus

    def _write_spec(self, claim: PreparedClaim) -> None:
        self.specs.write(claim.uid, build_spec(claim, self.files, self.library_of(claim), self.sim, self.state_dir,
                                               mps_shm=self.mps.root is not None))

    def library_of(self, claim: PreparedClaim) -> str:
        """The library build a claim's containers map: the one it was prepared with, as long as
        that file exists, so containers started after an upgrade map what the others map."""
        return claim.library if claim.library and os.path.isfile(claim.library) else self.host_library

    def _spec_library(self, uid: str) -> str | None:
        """The library build a claim's CDI spec mounts: read once, at recovery, for a claim a
        release that did not record the build prepared (the spec is never read back otherwise)."""
        try:
            with open(self.specs.path(uid)) as f:
                mounts = json.load(f).get("containerEdits", {}).get("mounts") or []
        except (OSError, ValueError, AttributeError):
            return None
        return next((m.get("hostPath") for m in mounts if isinstance(m, dict)
                     and m.get("containerPath") == CONTAINER_LIBRARY), None)

    def libraries_in_use(self) -> set[str]:
        """Every library build a prepared claim's spec names, and the one new claims get."""
        return {self.host_library} | {self.library_of(e.prepared) for _, e in self.checkpoint.items() if e.prepared}

    def prune_libraries(self) -> None:
        """Remove library builds of the hook dir that no prepared claim uses (install-hook keeps
        every build it installs: running containers map them)."""
        try:
            prune_versions(Path(self.host_library).parent, LIBRARY_NAME, self.libraries_in_use())
        except Exception:  # never fails a call: an unused file left behind is harmless
            log.exception("pruning unused library versions failed")

    # ---- Unprepare -------------------------------------------------------------------------

    def unprepare(self, namespace: str, name: str, uid: str) -> None:
        """Remove the claim's spec and files; a claim unknown to us is already unprepared."""
        with self._reasons("unprepare"), self.calls.hold():
            self._unprepare(namespace, name, uid)

    def _unprepare(self, namespace: str, name: str, uid: str) -> None:
        check_uid(uid, "claim uid")
        with self._locks.hold(uid):
            entry = self.checkpoint.get(uid)
            if entry is None and not self.files.exists(uid) and not self.specs.exists(uid):
                log.debug("claim not prepared here", claim=f"{namespace}/{name}", uid=uid, step="unprepare")
                return
            self._record_unprepare_started(uid, entry)
            self._remove(uid, "unprepare")
            self._apply_without(entry.prepared if entry else None)
            log.info("claim unprepared", claim=f"{namespace}/{name}", uid=uid, step="unprepare")
            self._tell(entry.prepared if entry else None, prepared=False)
        if entry and entry.prepared and entry.prepared.library not in (None, self.host_library):
            self.prune_libraries()  # it may have been the last claim on an older build

    @reaches("unprepare-started-recorded")
    def _record_unprepare_started(self, uid: str, entry: ckpt.Entry | None) -> None:
        if entry is not None:
            self.checkpoint.set(uid, replace(entry, state=ckpt.UNPREPARE_STARTED))

    @reaches("unprepare-completed")
    def _apply_without(self, claim: PreparedClaim | None) -> None:
        """The strategies learn that a prepared claim went (None: it never completed its Prepare)."""
        if claim is None:
            return
        try:
            self._apply(claim, self._prepared_now())
        except StrategyError as e:  # the claim is gone either way; its limits only ever loosen
            log.error("strategy not updated", uid=claim.uid, step="unprepare", error=str(e))

    def _remove(self, uid: str, why: str) -> None:
        self._remove_spec(uid)
        self._remove_files(uid)
        for strategy in self.strategies:  # after the files: a crash before this point leaves the entry, retried
            strategy.release(uid)
        self.checkpoint.delete(uid)
        log.debug("claim state removed", uid=uid, step="remove", reason=why)

    @reaches("unprepare-spec-removed")
    def _remove_spec(self, uid: str) -> None:
        self.specs.remove(uid)

    @reaches("unprepare-files-removed")
    def _remove_files(self, uid: str) -> None:
        self.files.remove(uid)

    # ---- Start-up --------------------------------------------------------------------------

    def recover(self) -> None:
        """Bring disk and checkpoint into agreement before the kubelet can call us.

        Under the call lock: an older instance still serving (a rolling upgrade) has no call
        half-way while this one rolls interrupted calls back.

        The checkpoint is not the only record: each prepared claim's folder holds its answer
        (prepared.json). A claim the checkpoint lacks (file deleted, corrupt, or an older
        copy restored) is adopted from its folder, never removed because a file is gone.
        """
        with self.calls.hold(take_hook=False):
            self._recover()

    def _recover(self) -> None:
        self.files.setup()
        os.makedirs(self.specs.root, mode=0o755, exist_ok=True)
        state_dir = os.path.dirname(self.checkpoint.path)
        for folder, prefix in ((self.specs.root, self.specs.prefix), (state_dir, "checkpoint.json")):
            for name in remove_temp_files(folder, prefix):
                log.info("removed the temporary file of an interrupted write", path=os.path.join(folder, name),
                         step="recover")
        try:
            written_boot = self.checkpoint.load()
        except ckpt.CheckpointCorrupt as e:
            aside = self.checkpoint.move_aside()
            log.error("checkpoint corrupt; moved aside and rebuilt from the claim folders", path=self.checkpoint.path,
                      moved_to=aside, error=str(e), step="recover")
            written_boot = None
        # A lost checkpoint cannot tell whether the node rebooted: regions are then kept as
        # they are (zeroing a region that live processes use would hand out memory twice).
        rebooted = written_boot is not None and written_boot != self.checkpoint.boot_id
        self._adopt_unrecorded_claims()
        for uid, entry in self.checkpoint.items():
            if not UID.fullmatch(uid):
                log.error("checkpoint entry with a bad uid dropped", uid=uid[:80], step="recover")
                self.checkpoint.delete(uid)
                continue
            claim = f"{entry.namespace}/{entry.name}"
            if entry.state != ckpt.PREPARE_COMPLETED or entry.prepared is None:
                log.warning("rolling back an interrupted call", claim=claim, uid=uid, state=entry.state,
                            step="recover")
                self._remove(uid, f"recovery from {entry.state}")
                continue
            prepared = entry.prepared
            # Prepared by a release that did not record its library build: the spec names it.
            if prepared.library is None and (library := self._spec_library(uid)):
                prepared = replace(prepared, library=library)
                self.checkpoint.set(uid, replace(entry, prepared=prepared))
            if self.files.repair(prepared):
                log.warning("claim files missing; rewritten (regions kept)", claim=claim, uid=uid, step="recover")
            elif rebooted:
                self.files.reset_regions(uid, len(prepared.gpus))
            if not self.specs.exists(uid):
                log.info("CDI spec missing (reboot?); rewriting", claim=claim, uid=uid, step="recover")
            # Always rewritten: a newer spec layout takes effect (the library stays the claim's).
            self._write_spec(prepared)
        known = {uid for uid, _ in self.checkpoint.items()}
        for uid in self.files.uids() - known:
            # No record anywhere (checkpoint and prepared.json both lost): its region may be
            # in use, so it stays; the claim's next Prepare reuses it, its Unprepare removes it.
            log.error("claim folder without a record kept; the claim's Prepare reuses it, its Unprepare removes it",
                      uid=uid, path=self.files.dir(uid), step="recover")
        for uid in self.specs.names() - known - self.files.uids():
            if UID.fullmatch(uid) and written_by(self.specs, uid, self.files):
                # (a spec that mounts nothing of ours, sharingStrategy None, stays: no container asks for it)
                log.warning("removing a CDI spec no claim owns", uid=uid, step="recover")
                self.specs.remove(uid)
        for strategy in self.strategies:
            strategy.recover(self._prepared_now())
        self.checkpoint.replace_all(dict(self.checkpoint.items()))  # records the current boot id
        log.info("state recovered", claims=len(known), rebooted=rebooted, step="recover")
        self.prune_libraries()

    def _adopt_unrecorded_claims(self) -> None:
        """Record as prepared every claim folder with a whole prepared.json the checkpoint lacks."""
        recorded = {uid for uid, _ in self.checkpoint.items()}
        adopted = {}
        for uid in self.files.uids() - recorded:
            try:
                prepared = self.files.read_prepared(uid)
            except PreparedError as e:  # logged again below as a folder without a record
                log.error("claim folder's record unreadable", uid=uid, error=str(e), step="recover")
                continue
            if prepared:
                adopted[uid] = ckpt.Entry(ckpt.PREPARE_COMPLETED, prepared.namespace, prepared.name, prepared)
        if adopted:
            log.warning("claims missing from the checkpoint adopted from their folders", uids=sorted(adopted),
                        step="recover")
            self.checkpoint.replace_all({**dict(self.checkpoint.items()), **adopted})

    def prepared_claims(self) -> dict[str, PreparedClaim]:
        """Every claim whose Prepare completed, by uid: as the checkpoint file has it, so that
        claims another plugin instance prepared on this node count too."""
        return {uid: e.prepared for uid, e in self.checkpoint.on_disk().items()
                if e.state == ckpt.PREPARE_COMPLETED and e.prepared is not None}


def _nvidia_device_nodes(gpus: tuple[PreparedGpu, ...]) -> tuple[str, ...]:
    nodes = [f"/dev/nvidia{g.minor}" for g in gpus]
    return (*nodes, *(p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools") if os.path.exists(p)))
