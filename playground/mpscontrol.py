"""A stand-in for nvidia-cuda-mps-control where no NVIDIA driver is installed (mock GPUs, tests).

Same command line and environment as the real one (nvidia-cuda-mps-control(1)): `-d` starts the
control daemon for the GPUs of CUDA_VISIBLE_DEVICES, listening in CUDA_MPS_PIPE_DIRECTORY and
logging to CUDA_MPS_LOG_DIRECTORY/control.log; without arguments it sends the commands on stdin
to that daemon and prints the replies. It keeps the limits as the real daemon does: defaults for
servers started later, per server for running ones (the real command names); `start_server -uid`
starts a pretend server (a pid, no GPU context), `shutdown_server <pid>` ends one normally. For
the simulated driver it keeps the server's active-thread percentage in the pipe folder
(hooklayout.SIM_MPS_FILE), so simulated CUDA processes that name the folder are MPS clients.

control.log is written in the real daemon's format (kubeletplugin/mpslayout.py: the lines the agent
reads, and the public logs they were taken from): `[<date> <time>.<ms> Control <pid>] <message>`, with a server's
start (`Starting new server <pid> for user <uid>`, `NEW SERVER <pid>: Ready`) and exit (`Server
<pid> exited with status <n>`: 0 for `shutdown_server` and `quit`). Every command is recorded too,
as `Command: <line>` (the stand-in's own record: what the real daemon logs of a command is not
matched here, and nothing reads it but tests).

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
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubeletplugin import mpslayout
from kubeletplugin.hooklayout import SIM_MPS_FILE, SIM_MPS_SERVER_MAX, sim_mps_server_text

SOCKET = "control"  # in the pipe folder (the real daemon keeps its control pipe there too)
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


def _serve(pipe: str, log_path: str) -> None:
    os.chdir(pipe)  # a relative socket name: a test's deep tmp folder passes the 108-byte sun_path limit
    if os.path.exists(SOCKET):
        os.unlink(SOCKET)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(SOCKET)
    listener.listen(8)
    running = True
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    me = os.getpid()
    with open(log_path, "a", buffering=1) as log:
        daemon = Daemon(log=lambda message, pid: log.write(log_line(message, pid)))
        daemon.log(f"Starting control daemon using socket {os.path.join(pipe, SOCKET)}", me)
        daemon.log(f"To connect CUDA applications to this daemon, set env {mpslayout.PIPE_ENV}={pipe}", me)
        daemon.log(f"Stand-in control daemon (gpushare-dra playground) for CUDA_VISIBLE_DEVICES={gpu}", me)
        while running:
            conn, _ = listener.accept()
            # separate reader and writer: a text file's write drops what its reader buffered
            with conn, conn.makefile("r") as commands, conn.makefile("w") as replies:
                for line in commands:
                    daemon.log(f"Command: {line.strip()}", me)
                    reply, running = daemon.handle(line)
                    replies.write(reply + "\n" if reply else "")
                    if not running:
                        break
                replies.write("\0\n")
            if running:
                _serve_simulated_clients(gpu, daemon.default_threads)
    listener.close()
    os.unlink(SOCKET)
    if os.path.exists(SIM_MPS_FILE):
        os.unlink(SIM_MPS_FILE)


def _serve_simulated_clients(gpu: str, threads: int) -> None:
    """Where the simulated driver looks (docs/interfaces.md, "Simulated MPS server"): processes
    started from now on that name this pipe folder are clients of this GPU's one server, at the
    server's active-thread percentage, as a real client gets the server's limit."""
    server = "mps-" + ("".join(c if c.isalnum() or c in "._-" else "-" for c in gpu) or "gpu")
    tmp = f".{SIM_MPS_FILE}.tmp"
    with open(tmp, "w") as f:
        f.write(sim_mps_server_text(server[:SIM_MPS_SERVER_MAX], threads))
    os.chmod(tmp, 0o644)
    os.rename(tmp, SIM_MPS_FILE)


def main(argv: list[str]) -> int:
    pipe = os.environ.get(mpslayout.PIPE_ENV, mpslayout.CONTAINER_PIPE_DIR)
    logs = os.environ.get(mpslayout.LOG_ENV, "/var/log/nvidia-mps")
    if argv[:1] == ["-d"]:
        if os.fork():  # the caller returns once the daemon listens, as the real -d does
            for _ in range(500):
                if os.path.exists(os.path.join(pipe, SOCKET)):
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
        _serve(pipe, os.path.join(logs, mpslayout.CONTROL_LOG))
        os._exit(0)
    try:
        os.chdir(pipe)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(SOCKET)
    except OSError as e:
        print(f"Cannot find MPS control daemon process ({e})", file=sys.stderr)
        return 1
    with conn, conn.makefile("w") as commands, conn.makefile("r") as replies:
        commands.write(sys.stdin.read())
        commands.flush()
        conn.shutdown(socket.SHUT_WR)
        for line in replies:
            if line == "\0\n":
                break
            sys.stdout.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
