"""Fault injection, programmable from tests while the server runs (thread-safe)."""

import threading
from dataclasses import dataclass


@dataclass
class _Match:
    method: str | None = None  # None matches every method
    path_contains: str | None = None  # None matches every path

    def matches(self, method, path):
        return ((self.method is None or self.method.upper() == method)
                and (self.path_contains is None or self.path_contains in path))


@dataclass
class _Failure:
    match: _Match
    remaining: int
    status: int


class Faults:
    def __init__(self, drop_watches_callback=None):
        self._lock = threading.Lock()
        self._failures = []
        self._watch_failures = []
        self._delays = {}  # _Match fields -> seconds
        self._drop_watches_callback = drop_watches_callback

    # --- programmed by tests ------------------------------------------------------------

    def fail_next(self, n, status=500, method=None, path_contains=None):
        """The next n requests matching method / path substring are answered with status."""
        with self._lock:
            self._failures.append(_Failure(_Match(method, path_contains), n, status))

    def set_delay(self, seconds, method=None, path_contains=None):
        """Delay matching requests by seconds; 0 removes the delay set for this match."""
        key = (method.upper() if method else None, path_contains)
        with self._lock:
            if seconds:
                self._delays[key] = seconds
            else:
                self._delays.pop(key, None)

    def drop_watches(self):
        """End every open watch stream now; clients must re-watch."""
        if self._drop_watches_callback:
            self._drop_watches_callback()

    def fail_next_watch(self, n=1, status=500):
        """The next n watch requests fail with status before any event is sent."""
        with self._lock:
            self._watch_failures.append(_Failure(_Match(), n, status))

    def clear(self):
        with self._lock:
            self._failures.clear()
            self._watch_failures.clear()
            self._delays.clear()

    # --- consulted by the server --------------------------------------------------------

    @staticmethod
    def _take(failures, method, path):
        for failure in failures:
            if failure.remaining > 0 and failure.match.matches(method, path):
                failure.remaining -= 1
                if failure.remaining == 0:
                    failures.remove(failure)
                return failure.status
        return None

    def take_failure(self, method, path, is_watch):
        """The status to fail this request with, or None; consumes one programmed failure."""
        with self._lock:
            if is_watch:
                status = self._take(self._watch_failures, method, path)
                if status:
                    return status
            return self._take(self._failures, method, path)

    def delay_for(self, method, path):
        with self._lock:
            return max((seconds for (m, p), seconds in self._delays.items()
                        if _Match(m, p).matches(method, path)), default=0)
