"""MIG instances made for claims, and the ledger that makes them crash-safe (docs/mig.md).

Prepare asks `acquire` for the instance of an allocated placement; Unprepare gives it back with
`release`; the instance is destroyed when its last claim is gone. Every step is recorded in
`<state-dir>/mig.json` (written atomically) before the next one:

    acquire:  placement free? -> ledger "creating" (with the MIG devices the GPU had) -> NVML create
              -> ledger "created" (its GPU instance ID and MIG UUID)
    release:  NVML destroy -> ledger entry dropped

`recover` (at start-up, with the claims the checkpoint has as prepared) finishes what a crash
left: an entry still "creating" has its instance (the one at its placement that the GPU did not
have before) destroyed; a "created" entry no prepared claim uses is destroyed; one they use is
kept (adopted); a prepared claim's instance the ledger lacks (the file lost) is recorded again.

An instance someone else made is never destroyed: one that sits exactly on the allocated
placement with the allocated profile (an operator's static layout) is used as it is and
recorded as "borrowed", left alone when its claims are gone; one that overlaps it fails Prepare.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from cdi.atomic import write_atomic
from dra_driver.log import get_logger
from dra_driver.mig import MigError, MigInstance, MigInstances, MigProfile
from kubeletplugin.prepared import PreparedClaim, PreparedMig

log = get_logger("kubeletplugin.mig")

LEDGER = "mig.json"
CREATING, CREATED, BORROWED = "creating", "created", "borrowed"


@dataclass(frozen=True)
class LedgerEntry:
    gpu: str  # parent GPU's UUID
    profile_id: int
    start: int
    state: str  # CREATING, CREATED, BORROWED
    existing: tuple[str, ...] = ()  # the GPU instances the GPU had before we created, "<id>@<start>" (CREATING)
    gpu_instance: int = 0
    compute_instance: int = 0
    uuid: str = ""  # the MIG device's
    claims: tuple[str, ...] = ()  # UIDs of the claims using it

    @property
    def placement(self) -> tuple[str, int, int]:
        return self.gpu, self.profile_id, self.start


class MigLedger:
    """The ledger file: read at start, rewritten whole (atomically) on every change."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LEDGER)
        self.entries: list[LedgerEntry] = []

    def load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                doc = json.load(f)
            self.entries = [LedgerEntry(**{**e, "existing": tuple(e.get("existing") or ()),
                                           "claims": tuple(e.get("claims") or ())}) for e in doc["instances"]]
        except FileNotFoundError:
            self.entries = []
        except (OSError, ValueError, KeyError, TypeError) as e:
            # unreadable: rebuilt from the prepared claims; what was half made stays until an operator looks
            log.error("MIG ledger unreadable; rebuilt from the prepared claims", path=self.path, error=str(e))
            self.entries = []

    def save(self) -> None:
        doc = {"version": 1, "instances": [asdict(e) for e in self.entries]}
        write_atomic(self.path, json.dumps(doc, indent=1, sort_keys=True).encode(), 0o600)

    def find(self, placement: tuple[str, int, int]) -> LedgerEntry | None:
        return next((e for e in self.entries if e.placement == placement), None)

    def put(self, entry: LedgerEntry) -> None:
        self.entries = [e for e in self.entries if e.placement != entry.placement] + [entry]
        self.save()

    def drop(self, entry: LedgerEntry) -> None:
        self.entries = [e for e in self.entries if e.placement != entry.placement]
        self.save()


def _gi(instance: MigInstance) -> str:
    return f"{instance.gi_id}@{instance.start}"


def _overlaps(a_start: int, a_size: int, b_start: int, b_size: int) -> bool:
    return a_start < b_start + b_size and b_start < a_start + a_size


@dataclass
class MigState:
    """The node's MIG instances for claims. `profiles(gpu uuid)` gives a GPU's profiles;
    `reached(step)` is the fault hook (faults.py: prepare-mig-recorded, prepare-mig-created)."""

    instances: MigInstances
    state_dir: str
    profiles: Callable[[str], tuple[MigProfile, ...]]
    reached: Callable[[str], None] = lambda step: None
    ledger: MigLedger = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self.ledger = MigLedger(self.state_dir)
        self.ledger.load()

    def acquire(self, claim_uid: str, mig: PreparedMig) -> tuple[PreparedMig, str]:
        """The instance of `mig`'s placement for the claim, made when nobody has it: (its record, MIG UUID)."""
        with self._lock:
            placement = (mig.parent_uuid, mig.profile_id, mig.start)
            entry = self.ledger.find(placement)
            if entry is not None and entry.state in (CREATED, BORROWED):
                if claim_uid not in entry.claims:
                    self.ledger.put(replace(entry, claims=(*entry.claims, claim_uid)))
                return self._record(mig, entry), entry.uuid
            profiles = self.profiles(mig.parent_uuid)
            profile = next((p for p in profiles if p.profile_id == mig.profile_id), None)
            if profile is None:
                raise MigError(f"GPU {mig.parent_uuid} has no MIG profile {mig.profile} now")
            existing = self.instances.list(mig.parent_uuid, profiles)
            for other in existing:
                if other.start == mig.start and other.profile_id == mig.profile_id and other.uuid:
                    log.info("MIG instance on the allocated placement made by someone else: used, never destroyed",
                             gpu=mig.parent_uuid, profile=mig.profile, start=mig.start, uuid=other.uuid)
                    entry = LedgerEntry(*placement, BORROWED, (), other.gi_id, other.ci_id, other.uuid, (claim_uid,))
                    self.ledger.put(entry)
                    return self._record(mig, entry), other.uuid
                size = next((p.size for p in profiles if p.profile_id == other.profile_id), 0)
                if _overlaps(other.start, size, mig.start, profile.size):
                    ours = next((e for e in self.ledger.entries if e.uuid and e.uuid == other.uuid), None)
                    whose = (f"of claim(s) {', '.join(ours.claims)}" if ours else
                             "which this driver did not make; it is left alone (docs/mig.md)")
                    raise MigError(f"the {mig.profile} placement at memory slice {mig.start} of GPU {mig.parent_uuid} "
                                   f"overlaps MIG device {other.uuid or f'(GPU instance {other.gi_id})'}, {whose}")
            self.ledger.put(LedgerEntry(*placement, CREATING, tuple(_gi(i) for i in existing), claims=(claim_uid,)))
            self.reached("prepare-mig-recorded")
            try:
                made = self.instances.create(mig.parent_uuid, profile, mig.start)
            except MigError:
                self.ledger.drop(self.ledger.find(placement) or LedgerEntry(*placement, CREATING))
                raise
            self.reached("prepare-mig-created")
            entry = LedgerEntry(*placement, CREATED, (), made.gi_id, made.ci_id, made.uuid, (claim_uid,))
            self.ledger.put(entry)
            log.info("MIG instance created", gpu=mig.parent_uuid, profile=mig.profile, start=mig.start,
                     uuid=made.uuid, claim=claim_uid)
            return self._record(mig, entry), made.uuid

    @staticmethod
    def _record(mig: PreparedMig, entry: LedgerEntry) -> PreparedMig:
        return replace(mig, gpu_instance=entry.gpu_instance, compute_instance=entry.compute_instance)

    def release_claim(self, claim_uid: str) -> None:
        """Release every instance the claim holds (Unprepare, a rolled-back Prepare)."""
        with self._lock:
            for entry in [e for e in self.ledger.entries if claim_uid in e.claims]:
                left = tuple(c for c in entry.claims if c != claim_uid)
                if left and entry.state != CREATING:
                    self.ledger.put(replace(entry, claims=left))
                else:
                    self._retire(entry)

    def _retire(self, entry: LedgerEntry) -> None:
        """Destroy what we made of `entry` (never a borrowed instance), then forget it."""
        if entry.state == CREATED:
            self._destroy(entry.gpu, entry.gpu_instance, entry.uuid)
        elif entry.state == CREATING:
            for found in self._on_placement(entry):
                if _gi(found) not in entry.existing:
                    self._destroy(entry.gpu, found.gi_id, found.uuid)
        self.ledger.drop(entry)

    def _on_placement(self, entry: LedgerEntry) -> list[MigInstance]:
        profiles = self.profiles(entry.gpu)
        return [i for i in self.instances.list(entry.gpu, profiles)
                if i.start == entry.start and i.profile_id == entry.profile_id]

    def _destroy(self, gpu: str, gi_id: int, uuid: str) -> None:
        # the GPU instance ID may name another instance by now (ours gone, someone else's made): check the UUID
        current = [i for i in self.instances.list(gpu, self.profiles(gpu)) if i.gi_id == gi_id]
        if current and current[0].uuid != uuid:
            log.warning("MIG instance already gone; its GPU instance ID now names another, left alone",
                        gpu=gpu, gpu_instance=gi_id, uuid=uuid, other=current[0].uuid)
            return
        if self.instances.destroy(gpu, gi_id):
            log.info("MIG instance destroyed", gpu=gpu, gpu_instance=gi_id, uuid=uuid)

    def recover(self, prepared: dict[str, PreparedClaim]) -> None:
        """Bring the ledger and the GPUs in line with the claims prepared now (see the module doc)."""
        with self._lock:
            users: dict[tuple[str, int, int], list[tuple[str, PreparedMig, str]]] = {}
            for uid, claim in prepared.items():
                for gpu in claim.gpus:
                    if gpu.mig:
                        users.setdefault((gpu.mig.parent_uuid, gpu.mig.profile_id, gpu.mig.start), []).append(
                            (uid, gpu.mig, gpu.uuid))
            for entry in list(self.ledger.entries):
                uids = tuple(uid for uid, _, uuid in users.get(entry.placement, []) if uuid == entry.uuid)
                if entry.state == CREATING or not uids:
                    log.warning("MIG instance no prepared claim uses: destroyed" if entry.state == CREATED else
                                "MIG instance of an interrupted Prepare: destroyed" if entry.state == CREATING else
                                "borrowed MIG instance no prepared claim uses: forgotten, left as it is",
                                gpu=entry.gpu, start=entry.start, uuid=entry.uuid or None, step="recover")
                    self._try(self._retire, entry)
                elif uids != entry.claims:
                    self.ledger.put(replace(entry, claims=uids))
            for placement, claims in users.items():
                if self.ledger.find(placement) is None:  # prepared, but the ledger lost it: adopt
                    uid, mig, uuid = claims[0]
                    log.warning("MIG instance of a prepared claim missing from the ledger: adopted",
                                gpu=mig.parent_uuid, start=mig.start, uuid=uuid, step="recover")
                    self.ledger.put(LedgerEntry(*placement, CREATED, (), mig.gpu_instance, mig.compute_instance, uuid,
                                                tuple(c[0] for c in claims)))

    def _try(self, step: Callable[[LedgerEntry], None], entry: LedgerEntry) -> None:
        try:
            step(entry)
        except MigError as e:  # kept in the ledger: the next start tries again
            log.error("MIG instance could not be cleaned up; kept in the ledger for the next start",
                      gpu=entry.gpu, start=entry.start, error=str(e), step="recover")
