"""A stand-in for nvidia-cuda-mps-control where no NVIDIA driver is installed (mock GPUs, tests).

Same command line and environment as the real one (nvidia-cuda-mps-control(1)): `-d` starts the
control daemon for the GPUs of CUDA_VISIBLE_DEVICES, listening in CUDA_MPS_PIPE_DIRECTORY and
logging to CUDA_MPS_LOG_DIRECTORY/control.log, with its pid in
CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid (as NVIDIA's MPS documentation says the real
one writes it); without arguments it sends the commands on stdin to that daemon and prints the
replies. It keeps the limits as the real daemon does: defaults for servers started later, per
server for running ones (the real command names); `start_server -uid` starts a pretend server
(a pid, no GPU context), `shutdown_server <pid>` ends one normally. One server per user, as the
real daemon runs them: a client asks on the pipe folder's socket (`new_client`) and gets its
user's server (its peer credentials name the user), a new one when none runs, `pending` while
another user's runs. Every connection is served on a thread of its own, as the real daemon
serves clients and control programs at once.

Who may command it (docs/security.md, "MPS: the control daemon"): with
GPUSHARE_MPS_CONTROL_DIRECTORY set (the plugin sets it to a folder no container mounts), control
commands are taken only on the socket there, and the pipe folder's socket, which the clients'
containers reach, takes client requests only (a command there is refused and logged). Without
it, commands are taken on the pipe folder's socket from root or the daemon's own user (the peer
credentials the kernel gives, SO_PEERCRED). Its files (pid file, the simulated server's file)
are made under fresh names with O_EXCL|O_NOFOLLOW in the control folder and renamed into the
pipe folder by folder descriptor: never through a link, never in a folder a tenant can write.

For the simulated driver it keeps the server's active-thread percentage in the pipe folder
(hooklayout.SIM_MPS_FILE), so simulated CUDA processes that name the folder are MPS clients.

control.log is written in the real daemon's format (kubeletplugin/strategies/mps/layout.py: the lines the agent
reads, and the public logs they were taken from): `[<date> <time>.<ms> Control <pid>] <message>`, with a server's
start (`Starting new server <pid> for user <uid>`, `NEW SERVER <pid>: Ready`) and exit (`Server
<pid> exited with status <n>`: 0 for `shutdown_server` and `quit`). Every command is recorded too,
as `Command: <line>`, and every refused one (the stand-in's own records: what the real daemon
logs of a command is not matched here, and nothing reads them but tests). A refused word is
logged and echoed cut to SHOWN_MAX characters, and a line longer than LINE_MAX ends its
connection: what a tenant sends never grows the log by more than a short line per command.

Test-only, the stand-in's own command (no real daemon knows it): `gpushare_simulate_server_fault
<server pid> [status]` makes the server end as a client's fatal GPU fault ends a real one (`Server
encountered a fatal exception. Shutting down`, then `Server <pid> exited with status <status>`,
default 1), and starts a new server for the same user at once with the default limits, as the
real daemon does for the next client; its reply is the new server's pid.

effective_share() is MPS's rule for a client: its CUDA_MPS_ACTIVE_THREAD_PERCENTAGE can lower
its share below its server's, never raise it.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubeletplugin.hooklayout import SIM_MPS_FILE, SIM_MPS_SERVER_MAX, sim_mps_server_text
from kubeletplugin.strategies.mps import layout as mpslayout

SOCKET = mpslayout.SOCKET  # in the pipe folder for clients; in the control folder for commands
CLIENT_REQUEST = "new_client"  # the stand-in's client request: a server for the peer's user
SESSION_TIMEOUT_S = 30.0  # a connection idle this long is closed (it holds only its own thread anyway)
MAX_SESSIONS = 128        # connections served at once on each socket
CLIENT_TIMEOUT_S = 5.0    # the command program's wait for the daemon's answer
LINE_MAX = 4096           # characters of one command line; a longer one ends its connection
SHOWN_MAX = 64            # characters of a refused word that its log line and reply show
SIMULATE_FAULT = "gpushare_simulate_server_fault"  # test-only: <server pid> [exit status, default 1]
SHUTDOWN_SERVER = "shutdown_server"                # <server pid> [-f]: a normal exit (status 0)
_next_pid = [40000]


def log_line(message: str, pid: int, now: float | None = None) -> str:
    """One control.log line as the real daemon writes it: `[2024-04-29 11:22:10.446 Control    73] ...`."""
    now = time.time() if now is None else now
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    return f"[{stamp}.{int(now * 1000) % 1000:03d} Control {pid:5d}] {message}\n"


@dataclass
class Server:
    threads: int
    pinned: dict[str, str]
    uid: int = 0


@dataclass
class Daemon:
    default_threads: int = 100
    default_pinned: dict[str, str] = field(default_factory=dict)
    servers: dict[int, Server] = field(default_factory=dict)
    log: Callable[[str, int], object] = field(default=lambda message, pid: None)  # (message, logging process's pid)

    def start_server(self, uid: int) -> int:
        _next_pid[0] += 1
        pid = _next_pid[0]
        self.servers[pid] = Server(self.default_threads, dict(self.default_pinned), uid)
        # (newer real daemons log the first line from the new server's process, older ones from theirs)
        self.log(mpslayout.LOG_SERVER_START.format(pid=pid, uid=uid), pid)
        self.log(mpslayout.LOG_SERVER_READY.format(pid=pid), os.getpid())
        return pid

    def client(self, pid: int, uid: int) -> str:
        """A client of user `uid` asks for its server: the one of its user, started when none runs;
        while another user's server runs it waits (the real daemon starts the new user's server
        once the running one's clients are done). The reply: the server's pid, or `pending`."""
        mine = [p for p, s in self.servers.items() if s.uid == uid]
        if mine:
            return str(mine[0])
        if self.servers:
            self.log(f"NEW CLIENT {pid} from user {uid}: Server is not ready, push client to pending list",
                     os.getpid())
            return "pending"
        return str(self.start_server(uid))

    def exit_server(self, pid: int, status: int) -> Server:
        server = self.servers.pop(pid)
        if status != 0:
            self.log(mpslayout.LOG_SERVER_FATAL, os.getpid())
        self.log(mpslayout.LOG_SERVER_EXIT.format(pid=pid, status=status), os.getpid())
        return server

    def handle(self, line: str) -> tuple[str, bool]:
        """(reply, keep running) for one command line."""
        words = line.split()
        if not words:
            return "", True
        cmd, args = words[0], words[1:]
        try:
            if cmd == mpslayout.QUIT:
                for pid in list(self.servers):
                    self.exit_server(pid, 0)
                return "", False
            if cmd == mpslayout.GET_SERVERS:
                return "\n".join(str(pid) for pid in self.servers), True
            if cmd == "start_server" and args[:1] == ["-uid"] and args[1].isdigit():
                self.start_server(int(args[1]))
                return "", True
            if cmd == SHUTDOWN_SERVER:
                self.exit_server(int(args[0]), 0)
                return "", True
            if cmd == SIMULATE_FAULT:
                status = int(args[1]) if len(args) > 1 else 1
                if status == 0 or int(args[0]) not in self.servers:
                    raise ValueError(line)
                return str(self.start_server(self.exit_server(int(args[0]), status).uid)), True
            if cmd == mpslayout.SET_DEFAULT_THREADS:
                self.default_threads = _percent(args[0])
                return "", True
            if cmd == "get_default_active_thread_percentage":
                return f"{self.default_threads:.1f}", True
            if cmd == mpslayout.SET_DEFAULT_PINNED:
                self.default_pinned[args[0]] = args[1]
                return "", True
            if cmd == mpslayout.SET_THREADS:
                self.servers[int(args[0])].threads = _percent(args[1])
                return "", True
            if cmd == "get_active_thread_percentage":
                return f"{self.servers[int(args[0])].threads:.1f}", True
            if cmd == mpslayout.SET_PINNED:
                self.servers[int(args[0])].pinned[args[1]] = args[2]
                return "", True
            if cmd == "get_device_pinned_mem_limit":
                return self.servers[int(args[0])].pinned.get(args[1], "0"), True
        except (IndexError, KeyError, ValueError):
            return f"Error: bad arguments to {cmd}", True
        return f"Error: unknown command {cmd}", True


def _percent(text: str) -> int:
    value = int(float(text))
    if not 1 <= value <= 100:
        raise ValueError(text)
    return value


def effective_share(server_threads: int, client_env: dict[str, str]) -> int:
    """A client's active-thread percentage: its env var lowers the server's, never raises it."""
    try:
        asked = int(float(client_env[mpslayout.THREAD_ENV]))
    except (KeyError, ValueError):
        return server_threads
    return max(1, min(asked, server_threads))


def shown(text: str) -> str:
    """A tenant's word as a log line or reply shows it: at most SHOWN_MAX characters, then its length
    (each refusal logged the whole word: 128 words of 1 MiB made 128 MiB of control.log)."""
    text = text.strip()
    return text if len(text) <= SHOWN_MAX else f"{text[:SHOWN_MAX]}... ({len(text)} characters)"


def _peer(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel tells it (SO_PEERCRED)."""
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid, gid


class _Files:
    """The daemon's files, written without following a link: each is made under a fresh name
    (O_EXCL, O_NOFOLLOW) in the control folder, the plugin's (or the pipe folder where there is
    none), and renamed into the pipe folder by folder descriptor."""

    def __init__(self, pipe: str, control: str | None) -> None:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        self.pipe = os.open(pipe, flags)
        self.tmp = os.open(control, flags) if control else self.pipe
        self._count = 0

    def publish(self, name: str, text: str) -> None:
        self._count += 1
        tmp = f".{name}.{os.getpid()}.{self._count}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=self.tmp)
        try:
            os.write(fd, text.encode())
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=self.tmp, dst_dir_fd=self.pipe)

    def remove(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.pipe)
        except OSError:
            pass


def _listen(folder_fd: int) -> socket.socket:
    """The daemon's socket (`control`) in a folder, replacing what a dead daemon left there."""
    os.fchdir(folder_fd)  # a relative name: a test's deep tmp folder passes the 108-byte sun_path limit
    try:
        os.unlink(SOCKET)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(SOCKET)
    listener.listen(64)
    listener.settimeout(0.2)
    return listener


class _Service:
    """The control daemon's connections, each on a thread of its own (the real daemon serves its
    clients and control programs at once): a peer that holds a connection open holds only that."""

    def __init__(self, daemon: Daemon, files: _Files, gpu: str, separate_control: bool) -> None:
        self.daemon = daemon
        self.files = files
        self.gpu = gpu
        self.separate_control = separate_control
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.published = 0
        self.me = os.getpid()

    def accept(self, listener: socket.socket, control: bool) -> None:
        sessions = threading.BoundedSemaphore(MAX_SESSIONS)  # per socket: clients never crowd out the plugin
        while not self.stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not sessions.acquire(blocking=False):  # a flood of held connections: the newest is closed
                conn.close()
                continue
            threading.Thread(target=self._session, args=(conn, control, sessions), daemon=True).start()

    def _session(self, conn: socket.socket, control: bool, sessions: threading.BoundedSemaphore) -> None:
        try:
            self.session(conn, control)
        finally:
            sessions.release()

    def session(self, conn: socket.socket, control: bool) -> None:
        pid, uid, _ = _peer(conn)
        conn.settimeout(SESSION_TIMEOUT_S)
        privileged = uid in (0, os.getuid())
        try:
            with conn, conn.makefile("r", errors="replace") as commands, conn.makefile("w") as replies:
                # Read at most LINE_MAX at a time: a tenant's endless line holds no more memory than that.
                for line in iter(lambda: commands.readline(LINE_MAX + 1), ""):
                    if len(line) > LINE_MAX:
                        self.daemon.log(f"Refused a command line of over {LINE_MAX} characters from pid {pid} "
                                        f"user {uid} ({shown(line)}); connection closed", self.me)
                        replies.write(f"Error: command line over {LINE_MAX} characters\n")
                        break
                    with self.lock:
                        reply, running = self.command(line, control, privileged, pid, uid)
                    replies.write(reply + "\n" if reply else "")
                    if not running:
                        break
                replies.write("\0\n")
        except OSError:  # the peer went, or held the connection past SESSION_TIMEOUT_S
            pass
        with self.lock:
            if self.daemon.default_threads != self.published and not self.stop.is_set():
                self.publish_server()

    def command(self, line: str, control: bool, privileged: bool, pid: int, uid: int) -> tuple[str, bool]:
        words = line.split()
        if not words:
            return "", True
        if not control and self.separate_control:
            return self.client(words, pid, uid), True
        if not privileged:  # where commands are taken, only from root or the daemon's own user
            self.daemon.log(f"Refused command {shown(words[0])} from pid {pid} user {uid}: not privileged", self.me)
            return f"Error: {shown(words[0])}: permission denied", True
        self.daemon.log(f"Command: {line.strip()}", self.me)
        reply, running = self.daemon.handle(line)
        if not running:
            self.stop.set()
        return reply, running

    def client(self, words: list[str], pid: int, uid: int) -> str:
        """A client's connection: it asks for a server (`new_client`), one per user (nvidia-cuda-
        mps-control(1)); control commands are not taken here (the control folder is the plugin's)."""
        if words[0] != CLIENT_REQUEST:
            self.daemon.log(f"Refused command {shown(words[0])} on the clients' socket from pid {pid} user {uid}",
                            self.me)
            return f"Error: {shown(words[0])}: not a client request (control commands are not taken from clients)"
        return self.daemon.client(pid, uid)

    def publish_server(self) -> None:
        """Where the simulated driver looks (docs/interfaces.md, "Simulated MPS server"): processes
        started from now on that name this pipe folder are clients of this GPU's one server, at the
        server's active-thread percentage, as a real client gets the server's limit."""
        server = "mps-" + ("".join(c if c.isalnum() or c in "._-" else "-" for c in self.gpu) or "gpu")
        self.files.publish(SIM_MPS_FILE, sim_mps_server_text(server[:SIM_MPS_SERVER_MAX], self.daemon.default_threads))
        self.published = self.daemon.default_threads


def _serve(pipe: str, log_path: str, control: str | None) -> None:
    files = _Files(pipe, control)
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    me = os.getpid()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with open(fd, "a", buffering=1) as log:
        log_lock = threading.Lock()

        def write(message: str, pid: int) -> None:
            with log_lock:
                log.write(log_line(message, pid))

        daemon = Daemon(log=write)
        service = _Service(daemon, files, gpu, control is not None)
        listeners = [(_listen(files.pipe), control is None)]
        if control is not None:
            listeners.append((_listen(files.tmp), True))
        files.publish(mpslayout.PID_FILE, f"{me}\n")
        daemon.log(f"Starting control daemon using socket {os.path.join(pipe, SOCKET)}", me)
        daemon.log(f"To connect CUDA applications to this daemon, set env {mpslayout.PIPE_ENV}={pipe}", me)
        daemon.log(f"Stand-in control daemon (gpushare-dra playground) for CUDA_VISIBLE_DEVICES={gpu}", me)
        with service.lock:
            service.publish_server()
        threads = [threading.Thread(target=service.accept, args=(listener, is_control), daemon=True)
                   for listener, is_control in listeners]
        for t in threads:
            t.start()
        service.stop.wait()
        for t in threads:
            t.join()
        for listener, _ in listeners:
            listener.close()
        os.fchdir(files.pipe)
        for name in (SOCKET, SIM_MPS_FILE, mpslayout.PID_FILE):
            files.remove(name)
        if control is not None:
            os.fchdir(files.tmp)
            try:
                os.unlink(SOCKET)
            except OSError:
                pass


def main(argv: list[str]) -> int:
    pipe = os.environ.get(mpslayout.PIPE_ENV, mpslayout.CONTAINER_PIPE_DIR)
    logs = os.environ.get(mpslayout.LOG_ENV, "/var/log/nvidia-mps")
    control = os.environ.get(mpslayout.CONTROL_DIR_ENV) or None
    if argv[:1] == ["-d"]:
        ready = os.path.join(control or pipe, SOCKET)
        if os.fork():  # the caller returns once the daemon listens, as the real -d does
            for _ in range(500):
                if os.path.exists(ready) and os.path.exists(os.path.join(pipe, mpslayout.PID_FILE)):
                    return 0
                time.sleep(0.01)
            print(f"the control daemon did not start listening in {pipe}", file=sys.stderr)
            return 1
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        _serve(pipe, os.path.join(logs, mpslayout.CONTROL_LOG), control)
        os._exit(0)
    try:
        os.chdir(pipe)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(CLIENT_TIMEOUT_S)
        conn.connect(SOCKET)
    except OSError as e:
        print(f"Cannot find MPS control daemon process ({e})", file=sys.stderr)
        return 1
    try:
        with conn, conn.makefile("w") as commands, conn.makefile("r") as replies:
            commands.write(sys.stdin.read())
            commands.flush()
            conn.shutdown(socket.SHUT_WR)
            for line in replies:
                if line == "\0\n":
                    break
                sys.stdout.write(line)
    except OSError as e:  # TimeoutError too: no answer within CLIENT_TIMEOUT_S
        print(f"The MPS control daemon did not answer ({e})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
