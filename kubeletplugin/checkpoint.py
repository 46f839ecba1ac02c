"""The plugin's checkpoint: which claims are prepared, and how far each got.

File `<state-dir>/checkpoint.json`, current format version 2:

    {"version": 2, "bootID": "<kernel boot id>", "claims": {"<uid>": {
        "state": "PrepareStarted" | "PrepareCompleted" | "UnprepareStarted",
        "namespace": "...", "name": "...", "prepared": {...} | null}},
     "checksum": "sha256:<hex of the canonical JSON of everything else>"}

`prepared` is a PreparedClaim's JSON (prepared.py), read back through its one reader: an entry
that does not parse makes the whole file CheckpointCorrupt (moved aside, rebuilt from the claim
folders). Version 1 (the first release) kept only completed claims as
{"version": 1, "claims": {"<uid>": {"namespace", "name", "gpus", "devices"}}, "checksum"};
`_migrate_v1` lifts it to version 2 through the same reader. Every write is atomic (temp,
fsync, rename, fsync dir).

Writes are group-committed: a caller changes the in-memory claims and then `commit()`s;
callers that queue while one write runs are covered by the next single write.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from typing import Any

from cdi import write_atomic
from dra_driver.log import get_logger

from .prepared import PreparedClaim, PreparedError

log = get_logger("kubeletplugin.checkpoint")

VERSION = 2
PREPARE_STARTED = "PrepareStarted"
PREPARE_COMPLETED = "PrepareCompleted"
UNPREPARE_STARTED = "UnprepareStarted"
STATES = (PREPARE_STARTED, PREPARE_COMPLETED, UNPREPARE_STARTED)


class CheckpointCorrupt(Exception):
    """The file exists but cannot be trusted; the message says why."""


@dataclass(frozen=True)
class Entry:
    """One claim's record: how far its last call got, and what a completed Prepare decided."""

    state: str  # STATES
    namespace: str
    name: str
    prepared: PreparedClaim | None  # set when PrepareCompleted (and while unpreparing one)

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "namespace": self.namespace, "name": self.name,
                "prepared": self.prepared.to_json() if self.prepared else None}


def checksum(payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def encode(claims: dict[str, Entry], boot_id: str | None) -> bytes:
    payload = {"version": VERSION, "bootID": boot_id, "claims": {uid: e.to_json() for uid, e in claims.items()}}
    return json.dumps({**payload, "checksum": checksum(payload)}, indent=1, sort_keys=True).encode()


def decode(data: bytes) -> tuple[dict[str, Entry], str | None]:
    """(claims, bootID) of a checkpoint file of any known version; CheckpointCorrupt if bad."""
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise CheckpointCorrupt(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise CheckpointCorrupt(f"expected an object, got {type(doc).__name__}")
    stored = doc.pop("checksum", None)
    if stored != checksum(doc):
        raise CheckpointCorrupt(f"checksum: mismatch (got {stored!r})")
    version = doc.get("version")
    claims = doc.get("claims")
    if version not in (1, VERSION):
        raise CheckpointCorrupt(f"version: unsupported (got {version!r}; this plugin reads 1 and {VERSION})")
    if not isinstance(claims, dict) or not all(isinstance(v, dict) for v in claims.values()):
        raise CheckpointCorrupt("claims: expected an object of claim entries")
    try:
        entries = {uid: (_migrate_v1 if version == 1 else _entry)(uid, e) for uid, e in claims.items()}
    except PreparedError as e:
        raise CheckpointCorrupt(str(e)) from None
    boot_id = doc.get("bootID") if version == VERSION else None
    return entries, boot_id if isinstance(boot_id, str) else None


def _entry(uid: str, doc: dict[str, Any]) -> Entry:
    where = f"claims[{uid!r}]"
    state, namespace, name = doc.get("state"), doc.get("namespace"), doc.get("name")
    if state not in STATES:
        raise PreparedError(f"{where}.state: expected one of {', '.join(STATES)} (got {state!r})")
    for key, value in (("namespace", namespace), ("name", name)):
        if not isinstance(value, str):
            raise PreparedError(f"{where}.{key}: expected a string (got {value!r})")
    raw = doc.get("prepared")
    if raw is None and state == PREPARE_COMPLETED:
        raise PreparedError(f"{where}.prepared: missing from a {PREPARE_COMPLETED} entry")
    prepared = None if raw is None else PreparedClaim.from_json(raw, f"{where}.prepared")
    if prepared is not None and prepared.uid != uid:
        raise PreparedError(f"{where}.prepared.uid: not the entry's uid (got {prepared.uid!r})")
    return Entry(str(state), str(namespace), str(name), prepared)


def _migrate_v1(uid: str, old: dict[str, Any]) -> Entry:
    """Version 1 recorded completed claims only, without device nodes or boot id."""
    prepared = {"namespace": old.get("namespace"), "name": old.get("name"), "uid": uid, "gpus": old.get("gpus"),
                "devices": old.get("devices")}
    return _entry(uid, {"state": PREPARE_COMPLETED, "namespace": old.get("namespace"), "name": old.get("name"),
                        "prepared": prepared})


class Checkpoint:
    def __init__(self, path: str, boot_id: str | None) -> None:
        self.path = path
        self.boot_id = boot_id
        self._claims: dict[str, Entry] = {}  # entries are frozen: handed out without copying
        self._lock = threading.Lock()  # guards _claims and the generation counters
        self._write_lock = threading.Lock()  # one file write at a time
        self._changed = 0  # generation of the in-memory claims
        self._written = 0  # generation on disk
        self._identity: tuple[int, ...] | None = None  # of the file as last read or written here
        self._view: tuple[tuple[int, ...] | None, dict[str, Entry]] = (None, {})  # on_disk()'s cache

    def _read(self) -> tuple[dict[str, Entry], str | None, tuple[int, ...]] | None:
        """(claims, boot id, file identity) of the file as it is now; None when there is none."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
                identity = _identity(os.fstat(f.fileno()))
        except FileNotFoundError:
            return None
        return (*decode(data), identity)

    def load(self) -> str | None:
        """Read the file (missing = empty); return the boot id it was written under."""
        read = self._read()
        if read is None:
            return self.boot_id
        claims, boot_id, identity = read
        with self._lock:
            self._claims = claims
            self._identity = identity
        return boot_id

    def reload_if_changed(self) -> None:
        """Read the file again if another plugin instance wrote it since this one last did.
        Only while no call of this process is changing claims (kubeletplugin/instances.py)."""
        try:
            identity = _identity(os.stat(self.path))
        except FileNotFoundError:
            return
        if identity != self._identity:
            self.load()

    def on_disk(self) -> dict[str, Entry]:
        """The entries the file holds now, read only when it changed; the last good read if it
        does not decode. For readers that run beside the calls (the node agent), even those of
        another plugin instance: a completed call is on disk before it returns."""
        try:
            identity: tuple[int, ...] | None = _identity(os.stat(self.path))
        except FileNotFoundError:
            identity = None
        cached_identity, entries = self._view
        if identity == cached_identity:
            return entries
        try:
            read = self._read()
            entries = read[0] if read is not None else {}
        except CheckpointCorrupt as e:
            log.error("checkpoint unreadable; the node agent keeps its last good read", path=self.path, error=str(e))
        self._view = (identity, entries)
        return entries

    def move_aside(self) -> str:
        """Keep a corrupt file for inspection; return its new path."""
        aside = f"{self.path}.corrupt-{os.getpid()}-{int.from_bytes(os.urandom(4), 'big'):08x}"
        os.rename(self.path, aside)
        return aside

    def get(self, uid: str) -> Entry | None:
        with self._lock:
            return self._claims.get(uid)

    def items(self) -> list[tuple[str, Entry]]:
        with self._lock:
            return list(self._claims.items())

    def set(self, uid: str, entry: Entry) -> None:
        with self._lock:
            self._claims[uid] = entry
            self._changed += 1
        self.commit()

    def delete(self, uid: str) -> None:
        with self._lock:
            if self._claims.pop(uid, None) is None:
                return
            self._changed += 1
        self.commit()

    def replace_all(self, claims: dict[str, Entry]) -> None:
        with self._lock:
            self._claims = claims
            self._changed += 1
        self.commit()

    def commit(self) -> None:
        """Return once the file holds at least the changes made before this call."""
        with self._lock:
            wanted = self._changed
        with self._write_lock:
            if self._written >= wanted:
                return  # a write that started after our change already covered it
            with self._lock:
                generation = self._changed
                data = encode(self._claims, self.boot_id)
            write_atomic(self.path, data, mode=0o600)
            self._written = generation
            self._identity = _identity(os.stat(self.path))


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """Tells one version of the file from another: every write is a new file renamed in."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
