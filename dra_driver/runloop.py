"""The run loop of every long-running command: start, serve until SIGTERM or SIGINT, stop."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Protocol

import structlog

SIGNAL_POLL_S = 0.2


class Service(Protocol):
    def stop(self) -> object: ...


def serve(start: Callable[[], Service], log: structlog.stdlib.BoundLogger, stopping: str) -> int:
    """Call `start`, wait for SIGTERM or SIGINT, log `stopping`, stop what `start` returned; the
    exit status (0). The handlers go in first: a signal while `start` runs stops the service once
    it has started, rather than killing the process half-way. An exception from `start` (a bad
    flag) propagates to the CLI's one-line error."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    service = start()
    # Wait in short slices: the kernel may deliver the signal to a gRPC or agent thread, which
    # does not interrupt an untimed wait here, so the main thread would never run the handler.
    # A timed wait returns, and Python then runs the pending handler in the main thread.
    while not stop.wait(SIGNAL_POLL_S):
        pass
    log.info(stopping)
    service.stop()
    return 0
