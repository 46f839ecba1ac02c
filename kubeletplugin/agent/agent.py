"""The node agent's loop: every --agent-interval, sample NVML, map processes to claims, lay out
each GPU's time slots and set each claim's slot and rate (shares.py); the metrics collector
reads the result at scrape time. The backstop (backstop.py) polls NVML on its own thread every
--backstop-interval. Each period also reads what the GPUs' MPS control daemons logged
(mpswatch.py: a server that ended abnormally is reported on the GPU's MPS claims). The agent
also owns the claim-status writer, fed by the driver's Prepare/Unprepare (it is one of the
driver's ClaimListeners).

What it reads of the kubelet plugin is narrow: the prepared claims (ClaimSource) and where
their files are (ClaimPaths), plus plain values (driver and node name, the backend's name)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Collection
from typing import Any, Protocol

from kubernetes import client

from dra_driver.config import MPS, NONE
from dra_driver.kube import API_BODY_MAX, BACKGROUND_API_TIMEOUT_S, api_deadline, read_body, rfc3339_now
from dra_driver.log import get_logger
from kubeletplugin.cdispec import SimDriver
from kubeletplugin.prepared import PreparedClaim

from .backstop import Backstop, kill_unit, kill_units
from .claimview import ClaimView
from .control import Control
from .guard import HOLD, KILL, Guard, Member, container_pids
from .mpswatch import MpsWatch
from .procmap import Owner, ProcessMap
from .regions import Region
from .relay import Relay, fill_pairs
from .sampler import GpuSample, Sampler, load_simulated_nvml
from .shares import MAX_SLOT_LOSS, Share, kernel_loss, plan_gpu
from .status import TOO_LONG, Condition, StatusWriter, kernels_too_long, oversubscribed

log = get_logger("agent")

COMPUTE_REASON = "GpuComputeShareExceeded"  # the Event of a compute hold (guard.py)
GUARD_RECORD = "guard-held.json"  # in the state dir: processes a hold may have stopped (guard.py)

# A pod on a GPU that no claim's reservedFor names (a new pod sharing a claim, or one using the
# GPU through another driver): the claims are read again at most every RESERVATIONS_S, for its
# first RESERVATION_TRIES, then every RESERVATIONS_SLOW_S.
RESERVATIONS_S = 0.5
RESERVATION_TRIES = 10
RESERVATIONS_SLOW_S = 30.0


class ClaimSource(Protocol):
    """The kubelet plugin's record (Driver)."""

    def prepared_claims(self) -> dict[str, PreparedClaim]:
        """Every claim whose Prepare completed, by uid."""
        ...


class ClaimPaths(Protocol):
    """Where a prepared claim's files are on the host (ClaimFiles)."""

    def limits_path(self, uid: str) -> str: ...

    def region_path(self, uid: str, i: int) -> str: ...

    def control_path(self, uid: str, i: int) -> str: ...


class Agent:
    def __init__(self, source: ClaimSource, files: ClaimPaths, api: client.ApiClient, driver_name: str,
                 node_name: str, backend: str, interval: float = 1.0, enforce: str = "kill",
                 sim: SimDriver | None = None, backstop_interval: float = 0.05, state_dir: str | None = None) -> None:
        """backend: the device backend's name, `nvml` or `mock` (the simulated NVML, through `sim`);
        state_dir: the plugin's, where the GPUs' MPS control daemons log (None: not followed)."""
        self.source = source
        self.files = files
        self.backend = backend
        self.interval = interval
        self.status = StatusWriter(api, driver_name)
        self.resource = client.ResourceV1Api(api)
        self.core = client.CoreV1Api(api)
        self._containers: dict[str, str] = {}  # container ID -> claim uid, pods with several claims
        self.backstop = Backstop(api, node_name, enforce, backend, backstop_interval)
        self.mps_watch = MpsWatch(api, node_name, state_dir)
        self.procs = ProcessMap()
        self.relay = Relay()  # the fill's (relay.py): a thread from the first GPU a Burst claim fills
        self.guard = Guard(enforce, self._compute_action,  # compute shares held from outside (guard.py)
                           os.path.join(state_dir, GUARD_RECORD) if state_dir else None)
        self._period_owners: dict[int, Owner] = {}  # the last period's process owners (the guard's units)
        self.claims: dict[str, ClaimView] = {}
        self.claims_generation = 0  # bumped after each change of claims: the backstop reads them again
        self.gpus: list[GpuSample] = []
        self.lock = threading.Lock()  # claims and gpus, shared with the metrics collector
        self.last_tick_s = 0.0
        self._sim = sim
        self._sampler: Sampler | None = None
        self._last_tick = 0.0
        self._stop = threading.Event()
        # the period and the backstop both refresh the claims; a period holds it throughout, so
        # neither closes a region the other is reading
        self._refresh_lock = threading.RLock()
        self._dirty = threading.Event()        # a claim was prepared: the backstop maps it now
        self._reservations_at = 0.0
        self._tries: dict[str, int] = {}  # pod UID -> reservation reads while it was unknown
        self._oversubscribed: dict[str, float] = {}  # GPU UUID -> limits' sum last reported (0: not over)
        self._short: dict[str, dict[int, Condition]] = {}  # claim uid -> host GPU index -> why short of its share
        self._thread = threading.Thread(target=self._run, name="agent", daemon=True)

    # ---- driver listener (kubeletplugin.driver.ClaimListener) --------------------------------------
    def claim_prepared(self, claim: PreparedClaim) -> None:
        self.status.prepared(claim, self._short.get(claim.uid))
        self._dirty.set()

    def claim_unprepared(self, claim: PreparedClaim) -> None:
        self.status.unprepared(claim)

    # ---- life -----------------------------------------------------------------------------------
    def start_status(self) -> Agent:
        """Write the status of the claims this plugin instance prepares and unprepares. Every
        instance does (during a rolling upgrade two serve calls); `start` the rest in one."""
        if not self.status.started:
            for claim in self.source.prepared_claims().values():  # statuses lost to a crash are written again
                self.status.prepared(claim)
            self.status.start()
        return self

    def start(self) -> Agent:
        """Sampling, pacing and the backstop: the node's one agent (kubeletplugin/instances.py)."""
        self.start_status()
        self.guard.resume()
        self._sampler = self._open_nvml()
        self.mps_watch.start()  # before the first period: the logs there are now are followed from their ends
        self._thread.start()
        if self._sampler is not None:
            self.backstop.start(self)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.backstop.stop()
        self.guard.stop()
        self.relay.stop()
        self.mps_watch.stop()
        self.status.stop()
        with self.lock:
            for c in self.claims.values():
                for ctl in c.controls:
                    if ctl is not None:
                        ctl.unplan()
                c.close()
            self.claims.clear()
            self.claims_generation += 1
        if self._sampler is not None:
            self._sampler.close()

    def _open_nvml(self) -> Sampler | None:
        try:
            if self.backend == "mock":
                if self._sim is None:
                    log.warning("mock backend without the simulated NVML: no GPU sampling")
                    return None
                load_simulated_nvml(self._sim.host_dir, self._sim.env(self._sim.state_path))
            return Sampler()
        except Exception as e:  # no NVML: telemetry from the regions only, no rate control or backstop
            log.error("NVML unavailable; sampling disabled", error=str(e))
            return None

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:
                log.exception("agent period failed")
            try:  # after the period's refresh: the claims it reports to are current
                self.mps_watch.poll(dict(self.claims).values())
            except Exception:
                log.exception("reading the MPS control daemons' logs failed")
            self.last_tick_s = time.monotonic() - started
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    # ---- one period -----------------------------------------------------------------------------
    def tick(self) -> None:
        with self._refresh_lock:
            self._tick()

    def _tick(self) -> None:
        self.refresh()
        samples = self._sampler.sample() if self._sampler else []
        claims = dict(self.claims)
        now = time.monotonic()
        seconds, self._last_tick = now - (self._last_tick or now), now
        for c in claims.values():
            c.process_memory = [{} for _ in c.gpus]
            c.count_period(seconds)
        on_gpu: dict[str, list[Share]] = {}
        time_sliced: set[str] = set()  # GPUs with a paced claim that is not MPS: the handover's period
        unpaced: set[str] = set()  # GPUs with a context nobody paces in time (None, an MPS server): no handover
        owners = self.procs.owners({pid for g in samples for pid in (*g.process_memory, *g.process_util)})
        for g in samples:
            for pid in set(g.process_memory) | set(g.process_util):
                owner = owners.get(pid)
                hit = self._claim_gpu(claims, owner.uid if owner else None, g.uuid)
                if hit is None:
                    continue
                c, i = hit
                c.process_memory[i][pid] = g.process_memory.get(pid, 0)
                c.shares[i].measured += g.process_util.get(pid, 0.0) / 100.0
        for uid in sorted(claims):  # the same order every period: slots stay put
            c = claims[uid]
            for i, gpu in enumerate(c.gpus):
                if c.sharing_strategy in (NONE, MPS):
                    unpaced.add(gpu.uuid)
                if gpu.compute_limit < 100:  # limit 100 is never paced
                    on_gpu.setdefault(gpu.uuid, []).append(c.shares[i])
                    # how many share the claim's rate if its region is forged; the fill is for a claim of one
                    c.shares[i].procs = len(c.process_memory[i])
                    if c.sharing_strategy != MPS:
                        time_sliced.add(gpu.uuid)
        for uuid, shares in on_gpu.items():  # from the regions: needs no NVML
            for s in shares:
                s.unpaced = uuid in unpaced
            total = plan_gpu(shares, mps_only=uuid not in time_sliced)
            if total > 1.0 + 1e-9 and self._oversubscribed.get(uuid) != round(total, 3):
                log.warning("GPU oversubscribed: the paced claims' compute limits sum to more than the GPU; "
                            "each gets its limit divided by the sum", gpu=uuid, percent=round(total * 100, 1))
            self._oversubscribed[uuid] = round(total, 3) if total > 1.0 + 1e-9 else 0.0
        for c in claims.values():
            for i, gpu in enumerate(c.gpus):
                if gpu.compute_limit < 100:
                    c.apply(i)
        paced = [(gpu.uuid, c.shares[i], c.regions[i], c.controls[i])
                 for c in claims.values() for i, gpu in enumerate(c.gpus) if gpu.compute_limit < 100]
        self.relay.watch(fill_pairs(paced))
        self._guard(claims, time_sliced, seconds, owners)
        self._report_shares(claims, time_sliced)
        self.procs.forget_except({pid for g in samples for pid in (*g.process_memory, *g.process_util)})
        with self.lock:
            self.gpus = samples

    def _guard(self, claims: dict[str, ClaimView], time_sliced: set[str], seconds: float,
               owners: dict[int, Owner]) -> None:
        """The compute guard's period (guard.py): each time-sliced GPU's paced claims as NVML measured
        them; a held claim's processes, every process of their containers, are the ones it stops."""
        if self._sampler is None or seconds <= 0:
            return
        on_gpu: dict[str, list[Member]] = {}
        for uid, c in claims.items():
            for i, gpu in enumerate(c.gpus):
                watched = gpu.mig is None  # NVML measures no process on a MIG device: nothing to judge by (docs/mig.md)
                if watched and gpu.compute_limit < 100 and gpu.uuid in time_sliced and c.sharing_strategy != MPS:
                    s = c.shares[i]
                    on_gpu.setdefault(gpu.uuid, []).append(Member((uid, i), s.limit, s.measured, s.paced,
                                                                  (s.period_us, s.start_us)))
        self._period_owners = owners
        self.guard.observe([m for m in on_gpu.values() if len(m) > 1], seconds)
        self.guard.enforce({key: self._held_pids(claims[key[0]], key[1]) for key in self.guard.held()})

    def _held_pids(self, c: ClaimView, i: int) -> list[int]:
        """The claim's processes on its GPU i (NVML's, mapped) and every process of their containers."""
        units = kill_units(c.process_memory[i], self._period_owners, self.backstop.own_cgroup)
        return sorted({pid for unit, pids in units.items()
                       for pid in (pids if unit.startswith("pid:") else container_pids(unit))})

    def _compute_action(self, key: tuple[str, int], action: str, limit: float, measured: float) -> bool:
        """The guard held the claim (HOLD), killed its processes on the GPU (KILL), or, under
        --enforce=report, would have (REPORT)."""
        c = self.claims.get(key[0])
        if c is None:
            return False
        gpu = c.gpus[key[1]].uuid
        if action == KILL:  # as the backstop kills (SIGKILL ends a stopped process too)
            units = kill_units(c.process_memory[key[1]], self._period_owners, self.backstop.own_cgroup)
            killed = sorted({pid for unit, pids in units.items() for pid in kill_unit(unit, pids, self.procs)})
            if not killed:
                return False
            what = f"its neighbours stayed short of their shares: killed pid(s) {', '.join(map(str, killed))}"
        elif action == HOLD:
            what = "its processes are stopped outside part of its time slot until it uses no more"
        else:
            what = "nothing done (--enforce=report)"
        self.backstop.event(c, COMPUTE_REASON, f"measured {measured * 100:.0f} % of GPU {gpu} against a compute "
                            f"limit of {limit * 100:.0f} % while a neighbour was short of its share: {what}",
                            sorted(c.pods))
        return True

    def _report_shares(self, claims: dict[str, ClaimView], time_sliced: set[str]) -> None:
        """ComputeShareHeld False in the status of each claim that does not get its compute share
        on a GPU: the GPU oversubscribed (each paced claim gets its limit over the limits' sum), or
        on a time-sliced GPU its kernels too long for its share (plan_gpu found no period in which
        its slot loses at most MAX_SLOT_LOSS; judged in busy periods: an idle claim keeps what it
        had). Written when a reason comes, changes or goes."""
        for uid in set(self._short) - set(claims):
            del self._short[uid]
        when = rfc3339_now()
        for uid, c in claims.items():
            had = self._short.get(uid, {})
            now = dict(had)
            for s, gpu in zip(c.shares, c.gpus, strict=True):
                old = now.get(gpu.index)
                over = self._oversubscribed.get(gpu.uuid, 0.0)
                if gpu.compute_limit >= 100:  # not paced: it has the whole GPU's time
                    cond = None
                elif over:
                    cond = oversubscribed(s, over, when)
                elif gpu.uuid in time_sliced and kernel_loss(s) > MAX_SLOT_LOSS:  # 0 while idle
                    cond = kernels_too_long(s, when)
                elif old is not None and old["reason"] == TOO_LONG and not s.busy:
                    continue
                else:
                    cond = None
                if cond is None:
                    now.pop(gpu.index, None)
                elif old is None or old["reason"] != cond["reason"]:
                    now[gpu.index] = cond
            if {i: x["reason"] for i, x in now.items()} != {i: x["reason"] for i, x in had.items()}:
                self._short[uid] = now
                claim = self.source.prepared_claims().get(uid)
                if claim is not None:
                    log.info("claim's compute share", claim=f"{c.namespace}/{c.name}",
                             short={i: x["reason"] for i, x in now.items()} or "held")
                    self.status.prepared(claim, now)

    @staticmethod
    def _claim_gpu(claims: dict[str, ClaimView], uid: str | None, uuid: str) -> tuple[ClaimView, int] | None:
        c = claims.get(uid) if uid else None
        if c is None:
            return None
        for i, gpu in enumerate(c.gpus):
            if gpu.uuid == uuid:
                return c, i
        return None

    # ---- claims and the process map ------------------------------------------------------------
    def sampler_process_memory(self, uuids: Collection[str] | None = None) -> dict[str, dict[int, int]]:
        return self._sampler.process_memory(uuids) if self._sampler else {}

    def refresh_if_needed(self) -> None:
        """The backstop's poll: map a just-prepared claim, or a pod on a GPU that no claim's
        reservedFor named when it was read (re-read at most every RESERVATIONS_S)."""
        if self._dirty.is_set():
            self.refresh()
            return
        pods = self.procs.unknown_pods | self.procs.unresolved_pods
        if pods:
            fresh = any(self._tries.get(p, 0) < RESERVATION_TRIES for p in pods)
            if time.monotonic() - self._reservations_at > (RESERVATIONS_S if fresh else RESERVATIONS_SLOW_S):
                self._tries = {p: self._tries.get(p, 0) + 1 for p in pods}
                self.refresh(reservations=True)

    def refresh(self, reservations: bool = False) -> None:
        """Claims from the checkpoint; the process map from their files, slots and pods."""
        with self._refresh_lock:
            self._dirty.clear()
            self._refresh_claims()
            claims = dict(self.claims)
            if reservations:
                self._reservations_at = time.monotonic()
                for c in claims.values():
                    c.pods = self._reserved_for(c.namespace, c.name, c.uid)
                self._containers = {k: v for k, v in self._containers.items() if v in claims}
                for pod in set(self.procs.unresolved_pods):
                    self._containers.update(self._containers_of(pod, claims))
            self.procs.update({u: c.limits_path for u, c in claims.items()},
                              {u: [s for r in c.regions if r for s in r.slots()] for u, c in claims.items()},
                              {u: set(c.pods) for u, c in claims.items()}, self._containers)

    def _reserved_for(self, namespace: str, name: str, uid: str) -> dict[str, str]:
        """The pods in the claim's status.reservedFor (the scheduler's word), UID -> name."""
        try:
            with api_deadline(BACKGROUND_API_TIMEOUT_S):  # the agent's period waits on it
                resp: Any = self.resource.read_namespaced_resource_claim(
                    name, namespace, _preload_content=False, _request_timeout=BACKGROUND_API_TIMEOUT_S)
                raw: dict[str, Any] = json.loads(read_body(resp, API_BODY_MAX))
        except Exception as e:  # the mount table still maps the claim's containers
            log.warning("cannot read the claim's reservedFor", claim=f"{namespace}/{name}", error=str(e))
            return {}
        if (raw.get("metadata") or {}).get("uid") != uid:
            return {}
        return {r["uid"]: r.get("name", "") for r in (raw.get("status") or {}).get("reservedFor") or []
                if r.get("resource") == "pods" and r.get("uid")}

    def _containers_of(self, pod_uid: str, claims: dict[str, ClaimView]) -> dict[str, str]:
        """Container ID -> claim uid for a pod holding several of our claims: its spec says which
        container uses which claim, its status which container has which ID."""
        ref = next(((c.namespace, c.pods[pod_uid]) for c in claims.values() if c.pods.get(pod_uid)), None)
        if ref is None:
            return {}
        try:
            with api_deadline(BACKGROUND_API_TIMEOUT_S):
                resp: Any = self.core.read_namespaced_pod(ref[1], ref[0], _preload_content=False,
                                                       _request_timeout=BACKGROUND_API_TIMEOUT_S)
                pod: dict[str, Any] = json.loads(read_body(resp, API_BODY_MAX))
        except Exception as e:  # the containers' mounts still tell, when they show
            log.warning("cannot read the pod", pod=f"{ref[0]}/{ref[1]}", error=str(e))
            return {}
        if (pod.get("metadata") or {}).get("uid") != pod_uid:
            return {}
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        claim_name = {r.get("name"): r.get("resourceClaimName") for r in spec.get("resourceClaims") or []}
        claim_name.update({r.get("name"): r.get("resourceClaimName")
                           for r in status.get("resourceClaimStatuses") or []})
        ours: dict[tuple[str, str | None], str] = {(c.namespace, c.name): c.uid for c in claims.values()}
        uses: dict[str, str] = {}  # container name -> our claim's uid
        for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            for used in (container.get("resources") or {}).get("claims") or []:
                uid = ours.get((ref[0], claim_name.get(used.get("name"))))
                if uid:
                    uses[container.get("name")] = uid
        out: dict[str, str] = {}
        for st in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            cid = (st.get("containerID") or "").rpartition("://")[2]
            if cid and st.get("name") in uses:
                out[cid] = uses[st["name"]]
        return out

    def _refresh_claims(self) -> None:
        current = self.source.prepared_claims()
        with self.lock:
            gone = set(self.claims) - set(current)
            for uid in gone:
                self.claims.pop(uid).close()
            new = set(current) - set(self.claims)
            self.claims_generation += bool(gone)
        views = {uid: self._view(current[uid]) for uid in new}  # reads the API: not under the lock
        with self.lock:
            self.claims.update(views)
            self.claims_generation += bool(views)

    def _view(self, claim: PreparedClaim) -> ClaimView:
        files = self.files
        uid = claim.uid
        regions: list[Region | None] = []
        controls: list[Control | None] = []
        for i in range(len(claim.gpus) if claim.injects_library else 0):
            try:
                regions.append(Region(files.region_path(uid, i)))
            except (OSError, ValueError) as e:
                log.error("cannot map a usage region", uid=uid, gpu=i, error=str(e))
                regions.append(None)
            try:
                controls.append(Control(files.control_path(uid, i)))
            except FileNotFoundError:  # prepared by an older plugin
                controls.append(None)
            except (OSError, ValueError) as e:
                log.error("cannot map a control file", uid=uid, gpu=i, error=str(e))
                controls.append(None)
        if not claim.injects_library:  # sharingStrategy None: nothing to map, nothing to pace
            regions, controls = [None] * len(claim.gpus), [None] * len(claim.gpus)
        pods = self._reserved_for(claim.namespace, claim.name, uid)
        shares = [Share(limit=g.compute_limit / 100.0, burst=g.compute_policy == "Burst",
                        trusted=controls[i] is not None) for i, g in enumerate(claim.gpus)]
        return ClaimView(uid, claim.namespace, claim.name, claim.gpus, files.limits_path(uid), regions, controls,
                         shares, [{} for _ in claim.gpus], pods=pods, sharing_strategy=claim.sharing_strategy)
