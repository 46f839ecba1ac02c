"""The trusted layer: NVML's per-process memory against each claim's limit, fast.

The library keeps a claim within its limit only for allocations it sees and only while its
region is honest. A static binary, a private loader, raw ioctls or a scribbled region escape
it, but the driver still counts the memory and NVML reports it by host pid. Every
`--backstop-interval` (50 ms) a thread asks NVML for each GPU's processes (one cheap call per
GPU, apart from the agent's 1 s telemetry), maps them to claims from kernel and API-server
facts only (procmap.py), and a claim whose processes hold more than limit + tolerance on a GPU
is a violation: under `--enforce=kill` (the default) the container of its largest process is
killed, every process of its cgroup, until the rest fits; one Warning Event on the claim and
on the pod per episode, counters, a log line. docs/security.md states the promise.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import threading
import time
import uuid
from collections.abc import Collection, Iterable, Iterator
from typing import Protocol

from kubernetes import client

from dra_driver.kube import BACKGROUND_API_TIMEOUT_S, api_deadline, plain, warning_event
from dra_driver.log import get_logger

from .claimview import ClaimView
from .procmap import Owner, ProcessMap, exiting, live

log = get_logger("agent.backstop")


class Agent(Protocol):
    """What the backstop reads of the node agent (agent.Agent) each poll."""

    claims: dict[str, ClaimView]
    claims_generation: int  # bumped after each change of claims
    procs: ProcessMap

    def refresh_if_needed(self) -> None: ...

    def sampler_process_memory(self, uuids: Collection[str] | None = None) -> dict[str, dict[int, int]]: ...

REASON = "GpuMemoryLimitExceeded"
# NVML counts each process's CUDA context, which the library does not: allow that much per
# process on real GPUs (none on the simulator), plus a share of the limit for rounding.
CONTEXT_BYTES = {"nvml": 512 << 20, "mock": 0}
TOLERANCE_FRACTION = 0.05
TOLERANCE_MIN = 16 << 20
KILL_ROUNDS = 5  # a container forking while it is killed: look again until none is left


def tolerance(limit: int, processes: int, backend: str) -> int:
    return max(TOLERANCE_MIN, int(limit * TOLERANCE_FRACTION)) + processes * CONTEXT_BYTES.get(backend, 0)


def _paths(cgroup: str) -> dict[str, str]:
    """/proc/<pid>/cgroup text -> {hierarchy-id:controllers: path}."""
    out = {}
    for line in cgroup.splitlines():
        hierarchy, _, path = line.rpartition(":")
        out[hierarchy] = path
    return out


def _inside(paths: dict[str, str], container: dict[str, str]) -> bool:
    """In the container's cgroup or below it (a tenant with a delegated cgroup tree may make
    sub-cgroups), in every hierarchy the container has."""
    return all((p := paths.get(h)) is not None and (p == c or p.startswith(c.rstrip("/") + "/"))
               for h, c in container.items())


def killable(cgroup: str, own: str | None) -> bool:
    """A container's cgroup, never the root nor one holding the agent (those kill the pid only)."""
    container = _paths(cgroup)
    return bool(container) and all(p not in ("", "/") for p in container.values()) and \
        not (own and _inside(_paths(own), container))


def cgroup_pidfds(cgroup: str) -> dict[int, int]:
    """Every process in the container's cgroup (or below it), pid -> a pidfd the caller closes:
    each is held while its cgroup is read, so a pid reused in between is never signalled."""
    container = _paths(cgroup)
    held: dict[int, int] = {}
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            fd = os.pidfd_open(int(name))
        except OSError:
            continue
        try:
            with open(f"/proc/{name}/cgroup") as f:
                inside = _inside(_paths(f.read()), container)
            if not inside and exiting(int(name)):  # a zombie main thread reads "/": its live threads tell
                text = live(int(name), lambda at: _read(f"{at}/cgroup"))[1]
                inside = text is not None and _inside(_paths(text), container)
        except OSError:
            inside = False
        if inside:
            held[int(name)] = fd
        else:
            os.close(fd)
    return held


def kill_cgroup(cgroup: str) -> list[int]:
    """SIGKILL every process in the container's cgroup (or below it); the pids."""
    killed: list[int] = []
    for _ in range(KILL_ROUNDS):
        held = cgroup_pidfds(cgroup)
        for fd in held.values():
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            os.close(fd)
        new = [p for p in held if p not in killed]
        killed += new
        if not new:  # (killed ones linger as zombies until reaped: only new pids count)
            break
    return killed


def kill_units(pids: Iterable[int], owners: dict[int, Owner], own: str | None) -> dict[str, list[int]]:
    """The processes on a GPU grouped by what is killed (or stopped) whole: their container's
    cgroup text, or `pid:<n>` for a process outside a container the agent may kill whole (a host
    process, or one in the agent's own cgroup)."""
    units: dict[str, list[int]] = {}
    for pid in pids:
        cgroup = owners[pid].cgroup if pid in owners else None
        units.setdefault(cgroup if cgroup and killable(cgroup, own) else f"pid:{pid}", []).append(pid)
    return units


def kill_unit(unit: str, pids: list[int], procs: ProcessMap | None) -> list[int]:
    """SIGKILL a unit of kill_units; the pids killed. The processes on the GPU first, by the pidfds
    the process map holds: whatever their threads do, no read of their cgroup is needed (issue 40);
    then every process of the container."""
    for pid in pids:  # (one the map no longer knows has exited since the poll)
        if procs is not None:
            procs.kill(pid)
    return list(pids) if unit.startswith("pid:") else list(dict.fromkeys([*pids, *kill_cgroup(unit)]))


_RANDOM = random.SystemRandom()  # from the kernel: nothing a tenant can predict


def poll_times(interval: float, stop: threading.Event) -> Iterator[float]:
    """When to poll (time.monotonic): one instant drawn at random in each period of `interval`.
    On a fixed schedule a tenant that learnt the phase (the moment a sacrificial container of its
    own was killed tells it) could hold memory over its limit in every gap between two polls and
    never be seen (issue 26, attack 4). At a random instant of each period a hold of h seconds is
    seen with a chance of at least h / interval whenever it is made, so the expected memory-time a
    tenant holds over its limit before the first sighting (which kills it) is at most
    excess x interval, however it times its holds: sum_i E h_i prod_j<i (1 - h_j/T) <= E T."""
    start = time.monotonic()
    while not stop.is_set():
        yield start + _RANDOM.uniform(0, interval)
        start = max(start + interval, time.monotonic() - interval)  # fell behind: no burst of polls to catch up


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


class Backstop:
    def __init__(self, api: client.ApiClient, node: str, enforce: str, backend: str, interval: float = 0.05) -> None:
        self.core = client.CoreV1Api(api)
        self.node = node
        self.enforce = enforce
        self.backend = backend
        self.interval = interval
        self._over: set[tuple[str, int]] = set()  # (uid, gpu) currently over: one Event per episode
        self._killed: dict[tuple[str, int], set[int]] = {}  # (uid, gpu) over -> the pids its episode killed
        self.violations: dict[tuple[str, int], int] = {}
        self.kills: dict[tuple[str, int], int] = {}
        self.total_violations = 0  # node totals: outlive the claims (the per-claim ones go with them)
        self.total_kills = 0
        self.last_poll_s = 0.0
        self._last_seen: tuple[object, ...] | None = None  # the last poll's NVML answer, owners and claims
        self._last_cue: tuple[object, ...] | None = None  # its NVML answer, map and claims generations
        self._claims_at: int | None = None  # the claims generation of _claims
        self._claims: tuple[dict[str, ClaimView], set[str]] = ({}, set())  # the claims, their GPUs
        self._own = _read("/proc/self/cgroup")
        self._procs: ProcessMap | None = None  # the agent's map: its pidfds name the processes NVML named
        # Events go out on their own thread: a slow API server never delays a kill
        self._events: queue.Queue[tuple[ClaimView, str, str, list[str]] | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- life -----------------------------------------------------------------------------------
    def start(self, agent: Agent) -> None:
        self._threads = [threading.Thread(target=self._run, args=(agent,), name="backstop", daemon=True),
                         threading.Thread(target=self._send_events, name="backstop-events", daemon=True)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        self._events.put(None)
        for t in self._threads:
            t.join(timeout=10)

    def _run(self, agent: Agent) -> None:
        for at in poll_times(self.interval, self._stop):
            self._stop.wait(at - time.monotonic())
            if self._stop.is_set():
                break
            started = time.monotonic()
            try:
                self.poll(agent)
            except Exception:
                log.exception("backstop poll failed")
            self.last_poll_s = time.monotonic() - started

    # ---- one poll -------------------------------------------------------------------------------
    def poll(self, agent: Agent) -> None:
        self._procs = agent.procs
        agent.refresh_if_needed()
        generation = agent.claims_generation
        if generation != self._claims_at:  # read again when they changed, not at each poll (100s of claims)
            claims = dict(agent.claims)
            self._claims = claims, {gpu.uuid for c in claims.values() for gpu in c.gpus}
            self._claims_at = generation
        claims, gpus = self._claims
        # only the GPUs a claim has: a process on any other GPU is no claim's (none at all: no query)
        memory = agent.sampler_process_memory(gpus) if gpus else {}
        # The same answer, no process exited and no mapping changed since a poll that mapped every
        # pid (the map's generation is read before owners(), so a change during it counts): the
        # owners are the same, and so are the verdicts.
        cue = (memory, agent.procs.settle(), generation)
        if cue == self._last_cue:
            return
        pids = {pid for procs in memory.values() for pid in procs}
        known = agent.procs.owners(pids)
        self._last_cue = cue if len(known) == len(pids) else None  # an unmapped pid is looked up again
        seen = (memory, known, generation)
        if seen == self._last_seen:  # the same bytes of the same processes of the same claims: same verdicts
            return
        self._last_seen = seen
        held: dict[tuple[str, int], dict[int, int]] = {}
        owners: dict[int, Owner] = {}
        for gpu_uuid, procs in memory.items():
            for pid, used in procs.items():
                owner = known.get(pid)
                c = claims.get(owner.uid) if owner else None
                if owner is None or c is None:
                    continue
                for i, gpu in enumerate(c.gpus):
                    if gpu.uuid == gpu_uuid:
                        held.setdefault((c.uid, i), {})[pid] = used
                        owners[pid] = owner
        for c in claims.values():
            for i, gpu in enumerate(c.gpus):
                if gpu.uuid in memory:  # a GPU NVML did not answer for is unread, not empty: its episodes go on
                    self.check(c, i, gpu.memory_limit, held.get((c.uid, i), {}), owners)

    def check(self, claim: ClaimView, i: int, limit: int, process_memory: dict[int, int],
              owners: dict[int, Owner] | None = None) -> None:
        """One (claim, GPU): process_memory = this claim's host pids on the GPU -> NVML bytes."""
        key = (claim.uid, i)
        held = sum(process_memory.values())
        if held <= limit + tolerance(limit, len(process_memory), self.backend):
            self._over.discard(key)
            self._killed.pop(key, None)
            return
        if key in self._over:
            # The same episode: the processes killed may still show (their memory goes as they
            # exit), but one that came since is no part of the kill: over the limit without the
            # killed ones, it is killed too (else it would live as long as the episode lasts)
            earlier = self._killed.get(key, set())
            rest = {pid: used for pid, used in process_memory.items() if pid not in earlier}
            if self.enforce == "kill" and sum(rest.values()) > limit + tolerance(limit, len(rest), self.backend):
                self._kill(claim, i, limit, rest, owners or {})
            return
        self._over.add(key)
        self.violations[key] = self.violations.get(key, 0) + 1
        self.total_violations += 1
        owners = owners or {}
        region = claim.regions[i]
        try:
            region_used = region.used if region else 0
        except ValueError:  # the claim went away while we looked (its region is closed)
            region_used = 0
        message = (f"processes of the claim hold {held} bytes on GPU {claim.gpus[i].uuid} (NVML), above the "
                   f"limit {limit}; the library accounted {region_used} (memory allocated around it)")
        log.warning("claim above its memory limit", claim=f"{claim.namespace}/{claim.name}", uid=claim.uid,
                    gpu=claim.gpus[i].uuid, held=held, limit=limit, accounted=region_used,
                    pids=sorted(process_memory), enforce=self.enforce)
        if self.enforce == "kill":
            killed = self._kill(claim, i, limit, process_memory, owners)
            message += f"; killed pid(s) {', '.join(map(str, killed))}"
        pods = {o.pod for pid, o in owners.items() if pid in process_memory and o.pod}
        self.event(claim, REASON, message, sorted(pods))

    def _kill(self, claim: ClaimView, i: int, limit: int, process_memory: dict[int, int],
              owners: dict[int, Owner]) -> list[int]:
        """Largest first, a whole container (cgroup) at a time, until the rest fits."""
        units = kill_units(process_memory, owners, self._own)
        left = sum(process_memory.values())
        killed: list[int] = []
        for unit, pids in sorted(units.items(), key=lambda kv: -sum(process_memory[p] for p in kv[1])):
            if left <= limit:
                break
            gone = kill_unit(unit, pids, self._procs)
            killed += gone
            left -= sum(process_memory[p] for p in pids)
            key = (claim.uid, i)
            self._killed.setdefault(key, set()).update(pids)
            self.kills[key] = self.kills.get(key, 0) + len(gone)
            self.total_kills += len(gone)
            log.warning("killed a container above its claim's memory limit (--enforce=kill)", pids=gone,
                        bytes=sum(process_memory[p] for p in pids), claim=f"{claim.namespace}/{claim.name}",
                        uid=claim.uid, gpu=claim.gpus[i].uuid)
        return killed

    # ---- Events ---------------------------------------------------------------------------------
    @property
    def own_cgroup(self) -> str | None:
        """The agent's own cgroup (/proc/self/cgroup): never a unit to kill or stop."""
        return self._own

    def event(self, claim: ClaimView, reason: str, message: str, pods: list[str]) -> None:
        """A Warning Event on the claim and on each of `pods` (UIDs) it names, from the Events thread."""
        self._events.put((claim, reason, message, pods))

    def _send_events(self) -> None:
        while (item := self._events.get()) is not None:
            claim, reason, message, pods = item
            self._event(claim, reason, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": claim.name,
                                "namespace": claim.namespace, "uid": claim.uid}, message)
            for pod in pods:
                name = claim.pods.get(pod)
                if name:
                    self._event(claim, reason, {"apiVersion": "v1", "kind": "Pod", "name": name,
                                        "namespace": claim.namespace, "uid": pod}, message)

    def _event(self, claim: ClaimView, reason: str, involved: dict[str, str], message: str) -> None:
        body = warning_event(involved, reason, message, namespace=claim.namespace, component="gpushare-dra-agent",
                             reporting_component="gpushare.dev/agent", host=self.node,
                             name=f"{involved['name']}.{uuid.uuid4().hex[:16]}")
        try:
            with api_deadline(BACKGROUND_API_TIMEOUT_S):
                self.core.create_namespaced_event(claim.namespace, plain(body),
                                                  _request_timeout=BACKGROUND_API_TIMEOUT_S)
        except Exception as e:  # the metric and the log line still tell
            log.error("cannot create the Event", object=f"{involved['kind']} {claim.namespace}/{involved['name']}",
                      error=str(e))
