"""A thread-safe log of served requests, for tests and benchmarks to count API traffic."""

import threading
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

    def add(self, record):
        with self._lock:
            self._records.append(record)

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
