"""Object storage: one global resourceVersion counter, a bounded event history, watch fan-out.

Stored objects are never mutated after they are stored (writers build new dicts), so readers
and watchers can share them without copying.
"""

import collections
import queue
import threading

from .errors import already_exists, expired, not_found
from .resources import RESOURCE_TYPES, ResourceType

ADDED, MODIFIED, DELETED, BOOKMARK = "ADDED", "MODIFIED", "DELETED", "BOOKMARK"
# Put on a subscription's queue to end the watch stream.
CLOSE = ("CLOSE", None)

HistoryEntry = collections.namedtuple("HistoryEntry", "rv resource_type type obj old")


def with_resource_version(obj, rv):
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}


class Subscription:
    """One watch: filters store events and queues (type, object) pairs for the stream."""

    def __init__(self, resource_type, namespace, selection):
        self.resource_type = resource_type
        self.namespace = namespace
        self.selection = selection
        self.events: queue.SimpleQueue[tuple[str, dict]] = queue.SimpleQueue()

    def translate(self, event_type, obj, old):
        """The event this watcher sees, if any; an object entering or leaving the selection
        shows up as ADDED or DELETED, as the real watch cache reports it."""
        if self.namespace and obj["metadata"].get("namespace") != self.namespace:
            return None
        matches_now = self.selection.matches(obj)
        if event_type != MODIFIED:
            return event_type if matches_now else None
        matched_before = self.selection.matches(old)
        if matches_now:
            return MODIFIED if matched_before else ADDED
        return DELETED if matched_before else None

    def offer(self, entry):
        if entry.resource_type is not self.resource_type:
            return
        event_type = self.translate(entry.type, entry.obj, entry.old)
        if event_type:
            self.events.put((event_type, entry.obj))


class Store:
    def __init__(self, history=1000):
        self._lock = threading.RLock()
        self._rv = 0
        self._objects: dict[ResourceType, dict[tuple[str, str], dict]] = {
            rt: {} for rt in RESOURCE_TYPES}  # type -> {(namespace, name): object}
        self._history: collections.deque[HistoryEntry] = collections.deque()
        self._history_limit = history
        self._oldest_resumable_rv = 0  # watches from an older RV get 410 Gone
        self._subscriptions = set()

    @property
    def resource_version(self):
        with self._lock:
            return self._rv

    def get(self, rt, namespace, name):
        with self._lock:
            obj = self._objects[rt].get((namespace, name))
        if obj is None:
            raise not_found(rt, name)
        return obj

    def exists(self, rt, namespace, name):
        with self._lock:
            return (namespace, name) in self._objects[rt]

    def all(self, rt):
        """Every stored object of type rt (a snapshot)."""
        with self._lock:
            return list(self._objects[rt].values())

    def list(self, rt, namespace, selection):
        """(matching objects sorted by namespace/name, list resourceVersion)."""
        with self._lock:
            items = [obj for (ns, _), obj in self._objects[rt].items()
                     if (not namespace or ns == namespace) and selection.matches(obj)]
            rv = self._rv
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items, rv

    def create(self, rt, obj, dry_run=False):
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        with self._lock:
            if key in self._objects[rt]:
                raise already_exists(rt, key[1])
            if dry_run:
                return obj
            stored = self._commit(rt, ADDED, key, obj, None)
        return stored

    def update(self, rt, namespace, name, compute, dry_run=False):
        """Replace an object with compute(current) atomically. compute may raise ApiError.
        An object marked for deletion whose finalizers are gone is deleted instead."""
        key = (namespace, name)
        with self._lock:
            old = self._objects[rt].get(key)
            if old is None:
                raise not_found(rt, name)
            new = compute(old)
            if dry_run or new is old:  # compute returns old itself for a no-op update
                return new
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                return self._commit(rt, DELETED, key, new, old)
            return self._commit(rt, MODIFIED, key, new, old)

    def delete(self, rt, namespace, name, mark_deleted, check=None, dry_run=False):
        """Delete now, or, when finalizers remain, store mark_deleted(current) (it sets
        deletionTimestamp) and let the last finalizer removal delete it. check(current) may
        raise ApiError to refuse (delete preconditions)."""
        key = (namespace, name)
        with self._lock:
            old = self._objects[rt].get(key)
            if old is None:
                raise not_found(rt, name)
            if check:
                check(old)
            if old["metadata"].get("finalizers"):
                if old["metadata"].get("deletionTimestamp"):
                    return old
                new = mark_deleted(old)
                return new if dry_run else self._commit(rt, MODIFIED, key, new, old)
            return old if dry_run else self._commit(rt, DELETED, key, old, old)

    def _commit(self, rt, event_type, key, obj, old):
        self._rv += 1
        stored = with_resource_version(obj, self._rv)
        if event_type == DELETED:
            del self._objects[rt][key]
        else:
            self._objects[rt][key] = stored
        entry = HistoryEntry(self._rv, rt, event_type, stored, old)
        self._history.append(entry)
        if len(self._history) > self._history_limit:
            self._oldest_resumable_rv = self._history.popleft().rv
        for sub in self._subscriptions:
            sub.offer(entry)
        return stored

    def watch(self, rt, namespace, selection, since_rv=None, send_initial=None):
        """Subscribe. since_rv None or 0: synthetic ADDED for current objects, then live;
        otherwise every event after since_rv. Raises 410 Expired when history no longer
        reaches back to since_rv."""
        sub = Subscription(rt, namespace, selection)
        with self._lock:
            if since_rv and since_rv < self._oldest_resumable_rv:
                raise expired(f"too old resource version: {since_rv} "
                              f"({self._oldest_resumable_rv})")
            if send_initial is None:
                send_initial = not since_rv
            if send_initial:
                items, _ = self.list(rt, namespace, selection)
                for obj in items:
                    sub.events.put((ADDED, obj))
            else:
                for entry in self._history:
                    if entry.rv > since_rv:
                        sub.offer(entry)
            self._subscriptions.add(sub)
        return sub

    def request_bookmark(self, sub, annotations=None):
        """Queue a BOOKMARK at the current RV behind every event already queued for sub."""
        with self._lock:
            metadata = {"resourceVersion": str(self._rv)}
            if annotations:
                metadata["annotations"] = annotations
            rt = sub.resource_type
            sub.events.put((BOOKMARK, {"kind": rt.kind, "apiVersion": rt.api_version,
                                       "metadata": metadata}))

    def watch_count(self):
        """How many watch streams are open (tests check that closed clients are noticed)."""
        with self._lock:
            return len(self._subscriptions)

    def unsubscribe(self, sub):
        with self._lock:
            self._subscriptions.discard(sub)

    def close_watches(self):
        with self._lock:
            for sub in self._subscriptions:
                sub.events.put(CLOSE)
