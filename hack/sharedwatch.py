"""One driver-wide ResourceSlice watch for every SliceController of a process, for the fleet
benchmarks (hack/bench-controller, hack/bench-fleet): a process that hosts 1,000 nodes' controllers
would otherwise hold 1,000 watches. The product has no such mode: each node's controller owns its
node's watch. (Imported from the scripts' own folder, which Python puts on sys.path.)"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client

from dra_driver.controller import SliceController, SliceWatch
from dra_driver.discovery import DeviceBackend


class SharedWatch:
    """One driver-wide SliceWatch: an event goes to its pool's controller, a re-list to all of
    them (as each controller's own watch would do)."""

    def __init__(self, api_client: client.ApiClient, driver: str):
        self.driver = driver
        self.watch = SliceWatch(api_client, f"spec.driver={driver}", self._dispatch)
        self._listeners: dict[str, Callable[[str | None], None]] = {}
        self._lock = threading.Lock()

    def _dispatch(self, pool: str | None) -> None:
        with self._lock:
            targets = list(self._listeners.values()) if pool is None else [self._listeners.get(pool)]
        for changed in targets:
            if changed:
                changed(pool)

    def subscription(self, pool: str, changed: Callable[[str | None], None]) -> Subscription:
        return Subscription(self, pool, changed)


class Subscription:
    """Stands in for a controller's own watch: starting it subscribes the pool, stopping leaves."""

    def __init__(self, shared: SharedWatch, pool: str, changed: Callable[[str | None], None]):
        self.shared, self.pool, self.changed = shared, pool, changed

    def start(self) -> Subscription:
        with self.shared._lock:
            self.shared._listeners[self.pool] = self.changed
        return self

    def stop(self) -> None:
        with self.shared._lock:
            self.shared._listeners.pop(self.pool, None)


class SharedWatchController(SliceController):
    """A SliceController whose watch is a subscription to the process's SharedWatch."""

    def __init__(self, shared: SharedWatch, api_client: client.ApiClient, node: str, backend: DeviceBackend,
                 **options: Any):
        super().__init__(api_client, shared.driver, node, backend, **options)
        self._watch: Any = shared.subscription(node, self._slices_changed)  # start() and stop() use it
