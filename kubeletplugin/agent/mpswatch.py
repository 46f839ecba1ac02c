"""The MPS fault domain, seen: the agent follows each GPU's control.log for MPS servers that
ended abnormally (docs/strategies.md, MPS).

Under MPS one client's fatal GPU fault ends its server, and with it the GPU context of every
client of that server: every MPS claim on the GPU (one control daemon per GPU serves them all,
kubeletplugin/strategies/mps/control.py). The control daemon starts a new server for the next client, so nothing
stays broken for an operator to see; the claims' processes just got CUDA errors. The agent reads
the daemon's log and says so: one Warning Event `MpsServerRestarted` on each MPS ResourceClaim
prepared on the GPU and on each pod its status.reservedFor names, and
`gpushare_mps_server_restarts_total{gpu,UUID}`.

What the daemon writes (mpslayout: the messages, and the public logs they were taken from):
`[<time> Control <pid>] Server <pid> exited with status <n>`, sometimes after `Server
encountered a fatal exception. Shutting down`. What counts as abnormal:

- a nonzero status: an error exit, or a server killed by a signal however the daemon writes that
  (a negative number, 128 + the signal, a raw wait status: all nonzero), or a status that does
  not read as a number (reported rather than missed);
- status 0 after a fatal-exception line that no exit line has answered yet.

Status 0 otherwise is a normal exit, never reported: `quit` (the plugin stops the daemon with
the GPU's last MPS claim), `shutdown_server`, a server handed to another user once its clients
are done.

Reading: every agent period (the agent's own thread, `poll`), each `<state-dir>/mps/<gpu
uuid>/log/control.log` is stat'ed and only new bytes are read (at most READ_MAX a period), so
an idle GPU costs one stat(2) a second. After each period the agent records how far it has read
(`<state-dir>/mps/<gpu uuid>/agent-read-position`), so a log that exists when the agent starts is
followed from there: a restarted plugin, or the instance taking over the node in a rolling
upgrade, neither reports old lines again nor misses those written while no agent ran (from the
log's end when there is no record for that file). A log that appears later (a daemon started
since) is read from its start; a file recreated (another inode) or truncated (shorter than what
was read) again from its start. Only whole lines are parsed.

The daemon itself: every period the agent also reads each GPU's daemon pid (the pid file in its
pipe folder, which no container can write) and checks that it lives. A daemon that ended while
its folders are there and the plugin did not mark them as stopping (mpslayout.STOPPING, written
before the plugin's own `quit`) ended abnormally: a `quit` the plugin did not send, a kill, a
crash. That is one Warning Event `MpsControlDaemonExited` on each MPS claim prepared on the GPU
(and its reserving pods), `gpushare_mps_daemon_exits_total{gpu,UUID}`, and a log line, within
one agent period. The next Prepare or Unprepare of an MPS claim on the GPU starts a new daemon.

Events go out on their own thread, as the backstop's do: a slow API server never holds up the
agent's period. The control log is written by the daemon on the host; containers get only the
pipe folder, never the log folder (docs/security.md).
"""

from __future__ import annotations

import os
import queue
import re
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from kubernetes import client

from dra_driver.config import MPS
from dra_driver.kube import BACKGROUND_API_TIMEOUT_S, api_deadline, plain, warning_event
from dra_driver.log import get_logger
from kubeletplugin.strategies.mps import layout as mpslayout

from .claimview import ClaimView

log = get_logger("agent.mpswatch")

REASON = "MpsServerRestarted"
DAEMON_REASON = "MpsControlDaemonExited"
READ_MAX = 1 << 20   # bytes of one log read in one period; the rest waits for the next
LINE_MAX = 64 << 10  # a longer unfinished line is dropped (it is none of the daemon's server lines)

# `[2024-04-29 11:22:10.446 Control    73] <message>`: the message after the first `] `
_LINE = re.compile(r"^\[[^\]]*\] (?P<message>.*?)\s*$")


def _message(template: str) -> re.Pattern[str]:
    """A mpslayout message template as a whole-message pattern: {pid}, {uid} digits, {status} a word."""
    pattern = re.escape(template)
    for name, part in (("pid", r"\d+"), ("uid", r"\d+"), ("status", r"\S+")):
        pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>{part})")
    return re.compile(pattern + "$")


_EXIT = _message(mpslayout.LOG_SERVER_EXIT)
_START = _message(mpslayout.LOG_SERVER_START)
_FATAL = _message(mpslayout.LOG_SERVER_FATAL)


@dataclass(frozen=True)
class ServerExit:
    pid: int
    status: str     # as the daemon wrote it
    abnormal: bool  # the module docstring says what counts


def _status_is_zero(status: str) -> bool:
    try:
        return int(status, 0) == 0
    except ValueError:
        return False


class ControlLog:
    """The server lines of one daemon's control.log, in order (a fatal-exception line makes the
    next exit abnormal whatever its status)."""

    def __init__(self) -> None:
        self._fatal = False
        self.server: int | None = None  # the latest server started (informational)

    def feed(self, line: str) -> ServerExit | None:
        """One line; a server's exit when it is one."""
        m = _LINE.match(line)
        if m is None:
            return None
        message = m["message"]
        if _FATAL.match(message):
            self._fatal = True
            return None
        if started := _START.match(message):
            self.server = int(started["pid"])
            return None
        ended = _EXIT.match(message)
        if ended is None:
            return None
        abnormal = self._fatal or not _status_is_zero(ended["status"])
        self._fatal = False
        return ServerExit(int(ended["pid"]), ended["status"], abnormal)


class LogTail:
    """New whole lines of one file, as `tail -F` follows it. `position`: a file where it keeps how
    far it has read (the file's device, inode and offset), so that the next follower (a restarted
    or upgraded plugin) goes on from there; without one, or when it names another file, a follower
    `from_end` starts at the end."""

    def __init__(self, path: str, from_end: bool, position: str | None = None) -> None:
        self.path = path
        self.position = position
        self._file_id: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""
        self._saved: tuple[tuple[int, int] | None, int] = (None, 0)
        if from_end:
            try:
                st = os.stat(path)
            except OSError:  # not there yet: once it is, it is new
                return
            self._file_id, self._offset = (st.st_dev, st.st_ino), st.st_size
            saved = self._load()
            if saved is not None and saved[0] == self._file_id and saved[1] <= st.st_size:
                self._offset = saved[1]
            self._saved = (self._file_id, self._offset)

    def _load(self) -> tuple[tuple[int, int], int] | None:
        if self.position is None:
            return None
        try:
            with open(self.position) as f:
                version, dev, ino, offset = f.read().split()
            return ((int(dev), int(ino)), int(offset)) if version == "v1" else None
        except (OSError, ValueError):  # none yet, or not ours: from the end
            return None

    def save(self) -> None:
        """Record how far the lines handed out so far go (after they have been dealt with)."""
        if self.position is None or self._file_id is None or (self._file_id, self._offset) == self._saved:
            return
        tmp = f"{self.position}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(f"v1 {self._file_id[0]} {self._file_id[1]} {self._offset - len(self._partial)}\n")
            os.replace(tmp, self.position)
            self._saved = (self._file_id, self._offset)
        except OSError as e:  # the folder went with the daemon; a later follower starts at the end
            log.debug("cannot record the MPS log position", path=self.position, error=str(e))

    def read(self) -> list[str]:
        try:
            st = os.stat(self.path)
        except OSError:  # gone (the daemon stopped): a file there later is another one
            self._file_id, self._offset, self._partial = None, 0, b""
            return []
        if (st.st_dev, st.st_ino) != self._file_id or st.st_size < self._offset:  # recreated or truncated
            self._file_id, self._offset, self._partial = (st.st_dev, st.st_ino), 0, b""
        if st.st_size == self._offset:
            return []
        try:
            with open(self.path, "rb") as f:
                opened = os.fstat(f.fileno())
                if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                    return []  # replaced between the stat and the open: the next period reads it
                f.seek(self._offset)
                data = f.read(READ_MAX)
        except OSError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > LINE_MAX:
            self._partial = b""
        return [line.decode(errors="replace") for line in lines]


class MpsWatch:
    """Follows every GPU's control daemon log under `state_dir` (None: nothing to follow)."""

    def __init__(self, api: client.ApiClient, node: str, state_dir: str | None) -> None:
        self.core = client.CoreV1Api(api)
        self.node = node
        self.state_dir = state_dir
        self._tails: dict[str, tuple[LogTail, ControlLog]] = {}  # GPU uuid ->
        self._lock = threading.Lock()
        self._restarts: dict[str, int] = {}  # GPU uuid -> abnormal server exits seen; outlives the daemon
        self._daemon_exits: dict[str, int] = {}  # GPU uuid -> daemon ends the plugin did not ask for
        self._daemons: dict[str, int] = {}  # GPU uuid -> the daemon pid last seen alive (or reported dead)
        self._events: queue.Queue[tuple[ClaimView, str, str] | None] = queue.Queue()  # (claim, reason, message)
        self._thread: threading.Thread | None = None

    def restarts(self) -> dict[str, int]:
        """GPU uuid -> abnormal server exits seen, for every GPU whose log was followed."""
        with self._lock:
            return dict(self._restarts)

    def daemon_exits(self) -> dict[str, int]:
        """GPU uuid -> control daemon ends the plugin did not ask for, for every GPU followed."""
        with self._lock:
            return dict(self._daemon_exits)

    # ---- life -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Follow the logs there are now from where the last agent left off (their ends when none
        did); start the Event sender."""
        for gpu in self._gpus():
            self._follow(gpu, from_end=True)
        self._thread = threading.Thread(target=self._send_events, name="mps-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._events.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    def _gpus(self) -> list[str]:
        if self.state_dir is None:
            return []
        try:
            return sorted(os.listdir(mpslayout.root(self.state_dir)))
        except OSError:  # no MPS claim was ever prepared here
            return []

    def _follow(self, gpu: str, from_end: bool) -> None:
        assert self.state_dir is not None
        self._tails[gpu] = (LogTail(mpslayout.control_log(self.state_dir, gpu), from_end,
                                    mpslayout.read_position(self.state_dir, gpu)), ControlLog())
        with self._lock:
            self._restarts.setdefault(gpu, 0)
            self._daemon_exits.setdefault(gpu, 0)

    # ---- one period -----------------------------------------------------------------------------
    def poll(self, claims: Iterable[ClaimView]) -> list[tuple[str, ServerExit]]:
        """Read what the daemons logged since the last period; report each abnormal server exit
        to the MPS claims on its GPU (`claims`: the agent's prepared claims). The exits seen."""
        gpus = self._gpus()
        for gone in set(self._tails) - set(gpus):  # the daemon stopped and its folders went
            del self._tails[gone]
            self._daemons.pop(gone, None)
        for gpu in gpus:
            if gpu not in self._tails:
                self._follow(gpu, from_end=False)  # a daemon started since: all its lines are new
        claims = list(claims)
        seen: list[tuple[str, ServerExit]] = []
        for gpu, (tail, parser) in self._tails.items():
            for line in tail.read():
                ended = parser.feed(line)
                if ended is None:
                    continue
                seen.append((gpu, ended))
                if ended.abnormal:
                    self._report(gpu, ended, claims)
                else:
                    log.info("MPS server exited", gpu=gpu, server_pid=ended.pid, status=ended.status)
            tail.save()
        for gpu in gpus:
            self._check_daemon(gpu, claims)
        return seen

    def _check_daemon(self, gpu: str, claims: list[ClaimView]) -> None:
        """Report the GPU's daemon once when it ended without the plugin stopping it."""
        assert self.state_dir is not None
        if os.path.lexists(mpslayout.stopping(self.state_dir, gpu)):
            self._daemons.pop(gpu, None)
            return
        pid = mpslayout.read_pid(self.state_dir, gpu)
        if pid is not None and mpslayout.daemon_alive(pid):
            self._daemons[gpu] = pid
            return
        ended = pid if pid is not None else self._daemons.get(gpu)  # its pid file gone with it (`quit`)
        if ended is None or ended < 0 or not os.path.isdir(mpslayout.gpu_dir(self.state_dir, gpu)):
            return  # never seen (not started yet), already reported, or the folder went
        self._daemons[gpu] = -ended  # reported: once
        with self._lock:
            self._daemon_exits[gpu] = self._daemon_exits.get(gpu, 0) + 1
        hit = [c for c in claims if c.sharing_strategy == MPS and any(g.uuid == gpu for g in c.gpus)]
        log.warning("MPS control daemon ended without the plugin stopping it", gpu=gpu, pid=ended,
                    claims=[f"{c.namespace}/{c.name}" for c in hit])
        message = (f"the MPS control daemon (pid {ended}) of GPU {gpu} ended without the plugin stopping it (a "
                   f"quit it did not send, a kill or a crash): this claim's processes lost their MPS server; the "
                   f"next Prepare or Unprepare of an MPS claim on this GPU starts a new daemon")
        for c in hit:
            self._events.put((c, DAEMON_REASON, message))

    def _report(self, gpu: str, ended: ServerExit, claims: list[ClaimView]) -> None:
        with self._lock:
            self._restarts[gpu] = self._restarts.get(gpu, 0) + 1
        hit = [c for c in claims if c.sharing_strategy == MPS and any(g.uuid == gpu for g in c.gpus)]
        log.warning("MPS server exited abnormally: the GPU's MPS claims lost their GPU contexts", gpu=gpu,
                    server_pid=ended.pid, status=ended.status, claims=[f"{c.namespace}/{c.name}" for c in hit])
        message = (f"the MPS server (pid {ended.pid}) of GPU {gpu} exited with status {ended.status}: a fatal "
                   f"GPU fault of one of its clients (any MPS claim on this GPU) ends the server, so this claim's "
                   f"processes on the GPU lost their GPU context and must restart; the control daemon starts a "
                   f"new server for the next client")
        for c in hit:
            self._events.put((c, REASON, message))

    # ---- Events ---------------------------------------------------------------------------------
    def _send_events(self) -> None:
        """Each Event on the claim and on each pod its status.reservedFor names (as the backstop's):
        `kubectl describe pod` shows why its containers lost the GPU."""
        while (item := self._events.get()) is not None:
            claim, reason, message = item
            involved = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": claim.name,
                         "namespace": claim.namespace, "uid": claim.uid}]
            involved += [{"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": claim.namespace, "uid": uid}
                         for uid, name in sorted(dict(claim.pods).items())]
            for obj in involved:
                body = warning_event(obj, reason, message, namespace=claim.namespace,
                                     component="gpushare-dra-agent", reporting_component="gpushare.dev/agent",
                                     host=self.node, name=f"{obj['name']}.{uuid.uuid4().hex[:16]}")
                try:
                    with api_deadline(BACKGROUND_API_TIMEOUT_S):
                        self.core.create_namespaced_event(claim.namespace, plain(body),
                                                          _request_timeout=BACKGROUND_API_TIMEOUT_S)
                except Exception as e:  # the metric and the log line still tell
                    log.error("cannot create the Event", object=f"{obj['kind']} {claim.namespace}/{obj['name']}",
                              error=str(e))
