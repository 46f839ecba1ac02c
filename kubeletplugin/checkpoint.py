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

Beside it, `checkpoint.json.journal` holds the changes since that file was written, one line
each, appended and fsynced: {"uid": "<uid>", "entry": {...} | null, "checksum": "sha256:..."}
(null: the claim's entry is gone). So a Prepare writes two short lines, not the whole
checkpoint, and costs the same with 1 or 1,000 claims held. The state is the file with the
journal replayed over it. Replaying is idempotent (a line sets or drops one entry), so the file
is rewritten whole and the journal emptied afterwards (compaction) without a window where
either order loses a change: when the journal holds more lines than claims (at least
COMPACT_MIN), at `replace_all`, when another plugin instance queues for its turn (an older
release reads only the file) and when the plugin stops. A torn last line (a crash half-way
through an append, whose call never returned) is ignored and the next write is a compaction;
a bad line before the last makes the whole checkpoint CheckpointCorrupt.

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

from cdi import fsync_dir, write_atomic
from dra_driver.log import get_logger

from .prepared import PreparedClaim, PreparedError

log = get_logger("kubeletplugin.checkpoint")

VERSION = 2
JOURNAL_SUFFIX = ".journal"
COMPACT_MIN = 64  # journal lines before a compaction, at the least
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


def journal_line(uid: str, entry: Entry | None) -> bytes:
    payload = {"uid": uid, "entry": entry.to_json() if entry else None}
    line = json.dumps({**payload, "checksum": checksum(payload)}, sort_keys=True, separators=(",", ":"))
    return line.encode() + b"\n"


def replay(claims: dict[str, Entry], journal: bytes) -> tuple[dict[str, Entry], int, bool]:
    """(claims with the journal's lines applied, lines applied, whether the last line was torn)."""
    claims = dict(claims)
    lines = journal.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # the text after the last newline: a torn append
    applied = 0
    for number, line in enumerate(complete, 1):
        try:
            doc = json.loads(line)
            stored = doc.pop("checksum", None) if isinstance(doc, dict) else None
            if stored != checksum(doc):
                raise CheckpointCorrupt("checksum: mismatch")
            uid, raw = doc.get("uid"), doc.get("entry")
            if not isinstance(uid, str) or not (raw is None or isinstance(raw, dict)):
                raise CheckpointCorrupt("expected {uid, entry}")
            if raw is None:
                claims.pop(uid, None)
            else:
                claims[uid] = _entry(uid, raw)
        except (ValueError, CheckpointCorrupt, PreparedError) as e:
            if number == len(complete) and not tail:
                return claims, applied, True  # the last line, cut short before its newline was fsynced
            raise CheckpointCorrupt(f"journal line {number}: {e}") from None
        applied += 1
    return claims, applied, bool(tail)


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


@dataclass
class _View:
    """What on_disk() read last: the file, and the journal up to `offset` replayed over it."""

    file_identity: tuple[int, ...] | None
    file_entries: dict[str, Entry]
    journal_file: tuple[int, int] | None
    offset: int
    entries: dict[str, Entry]


class Checkpoint:
    def __init__(self, path: str, boot_id: str | None) -> None:
        self.path = path
        self.journal_path = path + JOURNAL_SUFFIX
        self.boot_id = boot_id
        self._claims: dict[str, Entry] = {}  # entries are frozen: handed out without copying
        self._lock = threading.Lock()  # guards _claims, _pending, _compact and the generation counters
        self._write_lock = threading.Lock()  # one file write at a time
        self._changed = 0  # generation of the in-memory claims
        self._written = 0  # generation on disk
        self._pending: dict[str, Entry | None] = {}  # changed since the last write (None: deleted)
        self._compact = False  # the next write rewrites the file whole
        self._journal_lines = 0
        self._identity: tuple[int, ...] | None = None  # of the files as last read or written here
        self._view = _View(None, {}, None, 0, {})  # on_disk()'s last read

    def _read(self) -> tuple[dict[str, Entry], str | None, tuple[int, ...], int, bool] | None:
        """(claims, boot id, identity, journal lines, torn) of the files as they are now; None when
        there are none."""
        claims, boot_id, identity = self._read_file()
        try:
            with open(self.journal_path, "rb") as f:
                journal = f.read()
                identity += _identity(os.fstat(f.fileno()))
        except FileNotFoundError:
            journal = b""
        if not identity:
            return None
        replayed, lines, torn = replay(claims, journal)
        return replayed, boot_id, identity, lines, torn

    def _current_identity(self) -> tuple[int, ...]:
        identity: tuple[int, ...] = ()
        for path in (self.path, self.journal_path):
            try:
                identity += _identity(os.stat(path))
            except FileNotFoundError:
                pass
        return identity

    def load(self) -> str | None:
        """Read the files (missing = empty); return the boot id they were written under."""
        read = self._read()
        if read is None:
            return self.boot_id
        claims, boot_id, identity, lines, torn = read
        with self._lock:
            self._claims = claims
            self._identity = identity
            self._journal_lines = lines
            self._pending = {}
            self._compact = torn  # never append after a torn line
        return boot_id

    def reload_if_changed(self) -> None:
        """Read the files again if another plugin instance wrote them since this one last did.
        Only while no call of this process is changing claims (kubeletplugin/instances.py)."""
        identity = self._current_identity()
        if identity and identity != self._identity:
            self.load()

    def on_disk(self) -> dict[str, Entry]:
        """The entries the files hold now; the last good read if they do not decode. For readers
        that run beside the calls (the node agent, many times a second), even those of another
        plugin instance: a completed call is on disk before it returns. The file is parsed again
        only when it was rewritten, the journal only from where the last read ended."""
        view = self._view
        try:
            file_identity: tuple[int, ...] | None = _identity(os.stat(self.path))
        except FileNotFoundError:
            file_identity = None
        try:
            st = os.stat(self.journal_path)
            journal_file: tuple[int, int] | None = (st.st_dev, st.st_ino)  # a compaction replaces it
        except FileNotFoundError:
            journal_file = None
        try:
            if file_identity != view.file_identity:
                file_entries = self._read_file()[0]
                view = _View(file_identity, file_entries, journal_file, 0, file_entries)
            elif journal_file != view.journal_file:
                view = _View(file_identity, view.file_entries, journal_file, 0, view.file_entries)
            if journal_file is not None:
                with open(self.journal_path, "rb") as f:
                    f.seek(view.offset)
                    new = f.read()
                complete = new[:new.rfind(b"\n") + 1]  # a line still being appended waits for the next read
                if complete:
                    entries, _, _ = replay(view.entries, complete)
                    view = _View(view.file_identity, view.file_entries, journal_file, view.offset + len(complete),
                                 entries)
        except (CheckpointCorrupt, FileNotFoundError) as e:  # FileNotFoundError: replaced since the stat
            log.error("checkpoint unreadable; the node agent keeps its last good read", path=self.path, error=str(e))
            return self._view.entries
        self._view = view
        return view.entries

    def _read_file(self) -> tuple[dict[str, Entry], str | None, tuple[int, ...]]:
        """(claims, boot id, identity) of the file without its journal; a missing file is empty."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
                identity = _identity(os.fstat(f.fileno()))
        except FileNotFoundError:
            return {}, self.boot_id, ()
        return (*decode(data), identity)

    def move_aside(self) -> str:
        """Keep a corrupt checkpoint (and its journal) for inspection; return the file's new path."""
        aside = f"{self.path}.corrupt-{os.getpid()}-{int.from_bytes(os.urandom(4), 'big'):08x}"
        for path, to in ((self.path, aside), (self.journal_path, aside + JOURNAL_SUFFIX)):
            try:
                os.rename(path, to)
            except FileNotFoundError:
                pass
        with self._lock:
            self._compact = True
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
            self._pending[uid] = entry
            self._changed += 1
        self.commit()

    def delete(self, uid: str) -> None:
        with self._lock:
            if self._claims.pop(uid, None) is None:
                return
            self._pending[uid] = None
            self._changed += 1
        self.commit()

    def replace_all(self, claims: dict[str, Entry]) -> None:
        with self._lock:
            self._claims = claims
            self._compact = True
            self._changed += 1
        self.commit()

    def compact(self) -> None:
        """Rewrite the file whole and empty the journal (for a reader of the file alone: an older
        release's plugin instance). Under the call lock, as every write."""
        with self._lock:
            if not self._journal_lines and not self._pending and not self._compact:
                return
            self._compact = True
            self._changed += 1
        self.commit()

    def commit(self) -> None:
        """Return once the files hold at least the changes made before this call."""
        with self._lock:
            wanted = self._changed
        with self._write_lock:
            if self._written >= wanted:
                return  # a write that started after our change already covered it
            with self._lock:
                generation = self._changed
                pending, self._pending = self._pending, {}
                whole = self._compact or self._journal_lines + len(pending) > max(COMPACT_MIN, len(self._claims))
                self._compact = False
                data = encode(self._claims, self.boot_id) if whole else \
                    b"".join(journal_line(uid, entry) for uid, entry in pending.items())
            try:
                if whole:
                    write_atomic(self.path, data, mode=0o600)
                    # After the file: replaying the old journal over it changes nothing. A new, empty
                    # file rather than a truncation, so a reader part-way through the old one notices.
                    if os.path.exists(self.journal_path):
                        write_atomic(self.journal_path, b"", mode=0o600)
                    self._journal_lines = 0
                else:
                    _append(self.journal_path, data)
                    self._journal_lines += len(pending)
            except BaseException:
                with self._lock:
                    self._compact = True  # the next write covers everything, whatever got onto disk
                raise
            self._written = generation
            self._identity = self._current_identity()


def _append(path: str, data: bytes) -> None:
    """One write (a torn one can only cut the last line), then fsync; a new file's folder too."""
    created = not os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(os.path.dirname(path))


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """Tells one version of the file from another: every write is a new file renamed in."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
