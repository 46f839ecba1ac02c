"""A stand-in for nvidia-cuda-mps-control where no NVIDIA driver is installed (mock GPUs, tests).

Same command line and environment as the real one (nvidia-cuda-mps-control(1)): `-d` starts the
control daemon for the GPUs of CUDA_VISIBLE_DEVICES, listening in CUDA_MPS_PIPE_DIRECTORY and
logging to CUDA_MPS_LOG_DIRECTORY/control.log; without arguments it sends the commands on stdin
to that daemon and prints the replies. It keeps the limits as the real daemon does: defaults for
servers started later, per server for running ones (the real command names); `start_server -uid`
starts a pretend server (a pid, no GPU context). Every command is recorded in control.log. For
the simulated driver it keeps the server's active-thread percentage in the pipe folder
(hooklayout.SIM_MPS_FILE), so simulated CUDA processes that name the folder are MPS clients.

effective_share() is MPS's rule for a client: its CUDA_MPS_ACTIVE_THREAD_PERCENTAGE can lower
its share below its server's, never raise it.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass, field

from dra_driver import mpslayout
from dra_driver.hooklayout import SIM_MPS_FILE, SIM_MPS_SERVER_MAX, sim_mps_server_text

SOCKET = "control"  # in the pipe folder (the real daemon keeps its control pipe there too)
_next_pid = [40000]


@dataclass
class Server:
    threads: int
    pinned: dict[str, str]


@dataclass
class Daemon:
    default_threads: int = 100
    default_pinned: dict[str, str] = field(default_factory=dict)
    servers: dict[int, Server] = field(default_factory=dict)

    def handle(self, line: str) -> tuple[str, bool]:
        """(reply, keep running) for one command line."""
        words = line.split()
        if not words:
            return "", True
        cmd, args = words[0], words[1:]
        try:
            if cmd == mpslayout.QUIT:
                return "", False
            if cmd == mpslayout.GET_SERVERS:
                return "\n".join(str(pid) for pid in self.servers), True
            if cmd == "start_server" and args[:1] == ["-uid"] and args[1].isdigit():
                _next_pid[0] += 1
                self.servers[_next_pid[0]] = Server(self.default_threads, dict(self.default_pinned))
                return "", True
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
    daemon = Daemon()
    running = True
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    with open(log_path, "a", buffering=1) as log:
        log.write(f"[control] started for CUDA_VISIBLE_DEVICES={gpu}\n")
        while running:
            conn, _ = listener.accept()
            # separate reader and writer: a text file's write drops what its reader buffered
            with conn, conn.makefile("r") as commands, conn.makefile("w") as replies:
                for line in commands:
                    log.write(f"[control] {line.strip()}\n")
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
        _serve(pipe, os.path.join(logs, "control.log"))
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
