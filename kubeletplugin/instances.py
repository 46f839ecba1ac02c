"""Two plugin instances on one node at once: the old and the new pod of a rolling upgrade.

The kubelet (1.33+) keeps every registered instance of a driver and calls the newest one that
is connected, so during an upgrade either instance may get a call, and a claim prepared by one
may be unprepared by the other. Both share `--state-dir`. Two file locks there keep them apart:

- `CallLock` (`calls.lock`): the checkpoint and claim files change under it. One instance at a
  time holds it while it has calls in flight; inside that instance calls still run in
  parallel. An instance that takes it over reads the checkpoint again (the other one may have
  written it). A waiting instance queues on `calls.gate`, and a holder admits no new call while
  someone queues there, so a busy instance cannot starve the other. A holder that lets go while
  another instance queues first runs `on_handover` (the checkpoint is compacted into the one
  file an older release reads).
- `NodeLeader` (`leader.lock`): the work there must be one of per node (the node agent's
  pacing and backstop, ResourceSlice publishing) runs in the instance that holds it. A new
  instance waits for it and takes over when the old one stops.
- `Registrations` (`registered/<pod UID>`): which instances the kubelet has registered, so an
  instance told to stop (its pod deleted or evicted) keeps serving until its successor is
  registered: a pod created meanwhile never finds the node without a plugin.

flock(2) locks belong to an open file description and go away with the process, so a
killed instance never leaves either lock held.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dra_driver.log import get_logger

log = get_logger("kubeletplugin.instances")

LEADER_POLL_S = 0.2  # how often a waiting instance tries the leader lock
HANDOVER_POLL_S = 0.1  # how often a stopping instance looks for its successor's registration
CALLS_LOCK, CALLS_GATE, LEADER_LOCK = "calls.lock", "calls.gate", "leader.lock"  # in --state-dir
REGISTERED_DIR = "registered"  # in --state-dir
LOCK_FILES = (CALLS_LOCK, CALLS_GATE, LEADER_LOCK)


def _open_lock(path: str) -> int:
    os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
    return os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)


class CallLock:
    """Calls of this process hold it together; calls of another instance wait their turn.

    `on_take` runs each time this process takes the file lock, before the first call that
    holds it (the checkpoint is read again there).
    """

    def __init__(self, state_dir: str, on_take: Callable[[], None],
                 on_handover: Callable[[], None] = lambda: None) -> None:
        self._gate_path = os.path.join(state_dir, CALLS_GATE)
        self._calls_fd = _open_lock(os.path.join(state_dir, CALLS_LOCK))
        self._gate_fd = _open_lock(self._gate_path)
        self._on_take = on_take
        self._on_handover = on_handover
        self._gate = threading.Lock()  # one thread of this process on the gate at a time
        self._count_lock = threading.Lock()
        self._count = 0  # calls of this process holding the file lock
        self._closed = False

    @contextmanager
    def hold(self, take_hook: bool = True) -> Iterator[None]:
        """take_hook=False: start-up, which reads the checkpoint itself."""
        # Through the gate: a new call waits here while the other instance queues for its turn.
        with self._gate:
            fcntl.flock(self._gate_fd, fcntl.LOCK_EX)
            try:
                with self._count_lock:
                    first = self._count == 0
                    if first:  # no call of ours holds it: wait for the other instance to finish
                        fcntl.flock(self._calls_fd, fcntl.LOCK_EX)
                        try:
                            if take_hook:
                                self._on_take()
                        except BaseException:
                            fcntl.flock(self._calls_fd, fcntl.LOCK_UN)
                            raise
                    self._count += 1
            finally:
                fcntl.flock(self._gate_fd, fcntl.LOCK_UN)
        try:
            yield
        finally:
            with self._count_lock:
                self._count -= 1
                if self._count == 0:
                    if self._other_instance_waits():
                        try:
                            self._on_handover()
                        except Exception as e:  # the turn is handed over all the same
                            log.error("handing the call lock over", error=str(e))
                    fcntl.flock(self._calls_fd, fcntl.LOCK_UN)
                    if self._closed:
                        self._close_files()

    @property
    def closed(self) -> bool:
        return self._closed

    def _other_instance_waits(self) -> bool:
        """Another process holds the gate: it waits for calls.lock. (While a thread of ours holds
        the gate, no other process can.)"""
        if self._gate.locked():
            return False
        fd = _open_lock(self._gate_path)  # a new open file: our own gate lock would not block it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing the file lets go of the lock, if taken
        return False

    def close(self) -> None:
        """Close the lock files, once the last call in flight (past the shutdown grace) is done."""
        with self._count_lock:
            self._closed = True
            if self._count == 0:
                self._close_files()

    def _close_files(self) -> None:
        if self._calls_fd < 0:  # closed already (a plugin stopped twice)
            return
        os.close(self._calls_fd)
        os.close(self._gate_fd)
        self._calls_fd = self._gate_fd = -1


class NodeLeader:
    """The per-node work runs in one instance: this one once it holds `leader.lock`."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LEADER_LOCK)
        self._fd = _open_lock(self.path)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.held = False

    def try_take(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.held = True
        return True

    def take_later(self, on_taken: Callable[[], None]) -> None:
        """Wait (in a thread) for the instance holding the lock to stop, then run `on_taken`."""
        def wait() -> None:
            while not self._stop.wait(LEADER_POLL_S):
                if self.try_take():
                    log.info("the other plugin instance stopped; this one runs the node agent now",
                             lock=self.path)
                    on_taken()
                    return
        self._thread = threading.Thread(target=wait, name="leader-wait", daemon=True)
        self._thread.start()

    def stop_waiting(self) -> None:
        """No taking over from now on (a take-over in progress finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def release(self) -> None:
        """Let go of the lock; the caller has stopped the per-node work."""
        self.stop_waiting()
        if self.held:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self.held = False
        os.close(self._fd)


class Registrations:
    """One file per instance the kubelet has registered (`registered/<name>`, the pod UID), so
    that a stopping instance can tell when a newer one took over: the kubelet calls the newest
    connected instance, and this one may then go without a gap."""

    def __init__(self, state_dir: str, name: str) -> None:
        self.folder = os.path.join(state_dir, REGISTERED_DIR)
        self.path = os.path.join(self.folder, name)
        self._since: int | None = None  # our registration's mtime (ns); None: not registered

    @property
    def registered(self) -> bool:
        return self._since is not None

    def mark(self) -> None:
        """The kubelet registered this instance. Files of older instances go (they are gone, or
        stopping and looking only for newer ones than themselves)."""
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        with open(self.path, "w"):
            pass
        self._since = os.stat(self.path).st_mtime_ns
        for entry in os.scandir(self.folder):
            try:
                if entry.path != self.path and entry.stat().st_mtime_ns < self._since:
                    os.unlink(entry.path)
            except FileNotFoundError:
                pass

    def successor(self) -> str | None:
        """The name of an instance registered after this one, if any."""
        since = self._since
        if since is None:
            return None
        try:
            entries = list(os.scandir(self.folder))
        except FileNotFoundError:
            return None
        for entry in entries:
            try:
                if entry.path != self.path and entry.stat().st_mtime_ns >= since:
                    return entry.name
            except FileNotFoundError:
                continue
        return None

    def wait_for_successor(self, timeout: float) -> str | None:
        """Waits up to `timeout` seconds for a successor's registration; its name, or None. An
        instance the kubelet never registered waits for nothing."""
        if not self.registered:
            return None
        deadline = time.monotonic() + timeout
        while (name := self.successor()) is None and time.monotonic() < deadline:
            time.sleep(HANDOVER_POLL_S)
        return name

    def clear(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
