"""A thread-safe log of served requests, for tests and benchmarks to count API traffic."""

import threading
import time
from typing import NamedTuple

WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


class RequestRecord(NamedTuple):
    method: str
    path: str
    query: str
    status: int
    is_watch: bool


class RequestLog:
    def __init__(self):
        self._lock = threading.Lock()
        self._records = []
        self._last = time.monotonic()  # when the last request was recorded

    def add(self, record):
        with self._lock:
            self._records.append(record)
            self._last = time.monotonic()

    def wait_quiet(self, quiet_s, timeout):
        """Wait until no request was recorded for quiet_s seconds; False after timeout.
        A client's follow-ups (an event's re-list, a late first read) come at its own pace on a
        loaded machine: a test that counts a steady state starts counting once they are over."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                idle_for = time.monotonic() - self._last
            if idle_for >= quiet_s:
                return True
            if time.monotonic() + quiet_s - idle_for > deadline:
                return False
            time.sleep(quiet_s - idle_for)

    def records(self):
        with self._lock:
            return list(self._records)

    def reset(self):
        with self._lock:
            self._records.clear()

    def count(self, method=None, path_contains=None, writes_only=False):
        return sum(1 for r in self.records()
                   if (method is None or r.method == method.upper())
                   and (path_contains is None or path_contains in r.path)
                   and (not writes_only or r.method in WRITE_METHODS))
