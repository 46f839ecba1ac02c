"""The plugin's checkpoint: which claims are prepared, and how far each got.

File `<state-dir>/checkpoint.json`, current format version 2:

    {"version": 2, "bootID": "<kernel boot id>", "claims": {"<uid>": {
        "state": "PrepareStarted" | "PrepareCompleted" | "UnprepareStarted",
        "namespace": "...", "name": "...", "prepared": {...} | null}},
     "checksum": "sha256:<hex of the canonical JSON of everything else>"}

Version 1 (the first release) kept only completed claims as
{"version": 1, "claims": {"<uid>": {"namespace", "name", "gpus", "devices"}}, "checksum"};
`_migrate_v1` lifts it to version 2. Every write is atomic (temp, fsync, rename, fsync dir).

Writes are group-committed: a caller changes the in-memory claims and then `commit()`s;
callers that queue while one write runs are covered by the next single write.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading

from cdi import write_atomic

VERSION = 2
PREPARE_STARTED = "PrepareStarted"
PREPARE_COMPLETED = "PrepareCompleted"
UNPREPARE_STARTED = "UnprepareStarted"


class CheckpointCorrupt(Exception):
    """The file exists but cannot be trusted; the message says why."""


def checksum(payload: dict) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def encode(claims: dict, boot_id: str | None) -> bytes:
    payload = {"version": VERSION, "bootID": boot_id, "claims": claims}
    return json.dumps({**payload, "checksum": checksum(payload)}, indent=1, sort_keys=True).encode()


def decode(data: bytes) -> tuple[dict, str | None]:
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
    if version == 1:
        doc = _migrate_v1(doc)
    elif version != VERSION:
        raise CheckpointCorrupt(f"version: unsupported (got {version!r}; this plugin reads 1 and {VERSION})")
    claims = doc.get("claims")
    if not isinstance(claims, dict) or not all(isinstance(v, dict) and "state" in v for v in claims.values()):
        raise CheckpointCorrupt("claims: expected an object of claim entries")
    return claims, doc.get("bootID")


def _migrate_v1(doc: dict) -> dict:
    """Version 1 recorded completed claims only, without device nodes or boot id."""
    claims = {}
    for uid, old in (doc.get("claims") or {}).items():
        prepared = {"namespace": old["namespace"], "name": old["name"], "uid": uid, "gpus": old["gpus"],
                    "devices": old["devices"], "deviceNodes": []}
        claims[uid] = {"state": PREPARE_COMPLETED, "namespace": old["namespace"], "name": old["name"],
                       "prepared": prepared}
    return {"version": VERSION, "bootID": None, "claims": claims}


class Checkpoint:
    def __init__(self, path: str, boot_id: str | None):
        self.path = path
        self.boot_id = boot_id
        self._claims: dict[str, dict] = {}
        self._lock = threading.Lock()  # guards _claims and the generation counters
        self._write_lock = threading.Lock()  # one file write at a time
        self._changed = 0  # generation of the in-memory claims
        self._written = 0  # generation on disk

    def load(self) -> str | None:
        """Read the file (missing = empty); return the boot id it was written under."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return self.boot_id
        claims, boot_id = decode(data)
        with self._lock:
            self._claims = claims
        return boot_id

    def move_aside(self) -> str:
        """Keep a corrupt file for inspection; return its new path."""
        aside = f"{self.path}.corrupt-{os.getpid()}-{int.from_bytes(os.urandom(4), 'big'):08x}"
        os.rename(self.path, aside)
        return aside

    def get(self, uid: str) -> dict | None:
        with self._lock:
            entry = self._claims.get(uid)
            return copy.deepcopy(entry) if entry else None

    def items(self) -> list[tuple[str, dict]]:
        with self._lock:
            return copy.deepcopy(list(self._claims.items()))

    def set(self, uid: str, entry: dict) -> None:
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

    def replace_all(self, claims: dict[str, dict]) -> None:
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
