"""The GPUs' MPS control daemons, run by the plugin on the host side (docs/strategies.md).

One nvidia-cuda-mps-control daemon per GPU serves every claim on that GPU that chose
sharingStrategy MPS (their kernels run side by side in one server); a claim that did not choose
MPS never gets the GPU's pipe folder, so it never joins that server. The plugin starts a daemon
with the first MPS claim of its GPU (`-d`: it outlives a plugin restart or upgrade, found again
through its pipe folder), tells it the limits after every Prepare and Unprepare of an MPS claim,
and stops it (`quit`) with the last. After a node reboot, recovery starts it again.

Where it runs: with --driver-root set and --mps-control at its default, the driver root's own
nvidia-cuda-mps-control, chrooted there in a mount namespace of its own (root.py,
control_program); otherwise --mps-control as given, in the plugin's container (the stand-in).

Talking to it (docs/security.md, "MPS: the control daemon"): the daemon's folders are the
plugin's (mpslayout): containers get the pipe folder read-only, never the control and log
folders. Before each command the plugin checks who answers on the socket it is about to use:
the folder is a real folder (never a link) that only root can write, the socket a socket, and
the process that accepts the connection (SO_PEERCRED) is the daemon whose pid the pid file
names, running as root or as the plugin's user; anything else is an MpsError naming what
answered. Commands go through the control folder where the daemon listens there (the stand-in),
else through the pipe folder (NVIDIA's daemon). Every wait is bounded (CONNECT_TIMEOUT_S,
COMMAND_TIMEOUT_S), and whether a daemon runs is its pid's, never an answer's: a daemon slow to
answer is an error, never a reason to start a second one.

Limits go through the daemon's stdin protocol (the real command names, mpslayout): MPS sets
limits per server, not per client, so the trusted ceiling is the largest compute share and
memory budget among the GPU's MPS claims; each client's own share reaches it as
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, which MPS lets a client
lower, never raise past the server's. Equal shares (partition mode) make the ceiling each
claim's share exactly; the library still holds each claim's memory budget, and holds the
claim's processes together to its compute share in SM-time (hook/src/pacing.c, mps_scale).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence

from dra_driver.log import get_logger
from kubeletplugin import tmpfs
from kubeletplugin.prepared import PreparedGpu

from . import layout as mpslayout
from . import root as mpsroot

log = get_logger("kubeletplugin.mps")

COMMAND_TIMEOUT_S = 3.0   # one command program's run (the daemon answers in milliseconds)
CONNECT_TIMEOUT_S = 1.0   # the plugin's own check of who answers
START_TIMEOUT_S = 5.0
# The GPU's /dev/shm on GPU nodes, shared by its MPS claims' containers (read-write): a tmpfs of
# this size, not the state disk. NVIDIA's server and clients keep small files there; how much is
# not measured on hardware (hack/gpu-validate.sh's MPS section lists them).
SHM_SIZE = 64 << 20
MPS_CONTROL = "nvidia-cuda-mps-control"  # --mps-control: found on PATH (the driver root's bin)


class MpsError(RuntimeError):
    """The control daemon could not be reached or refused a command."""


def _check_folder(path: str) -> None:
    """A folder the plugin talks through: a real folder (not a link), writable by root only."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise MpsError(f"{path}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: the plugin "
                       "talks to the MPS control daemon only through a folder only it can write")


DRIVER_ROOT_BIN = ("usr/bin", "bin", "usr/sbin", "usr/local/bin")  # where a driver root keeps the program
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def control_program(configured: Sequence[str], driver_root: str | None) -> tuple[list[str], str | None]:
    """(argv, driver root to run it in): NVIDIA's program from `driver_root` when --mps-control was
    left at its default and the root has it (no flag needed on a GPU node); else `configured`, as
    it is, in the plugin's own container (the stand-in, a test, an image that has the program)."""
    if list(configured) == [MPS_CONTROL] and driver_root:
        for folder in DRIVER_ROOT_BIN:
            if os.path.lexists(os.path.join(driver_root, folder, MPS_CONTROL)):
                return [f"/{folder}/{MPS_CONTROL}"], os.path.abspath(driver_root)
    return list(configured), None


def _clear(folder: str) -> None:
    """Remove the entries of one of the plugin's folders (never following a link: unlink does not)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


class MpsControl:
    def __init__(self, state_dir: str, control: Sequence[str], root: str | None = None) -> None:
        self.state_dir = state_dir
        self.control = list(control)  # argv of nvidia-cuda-mps-control (or a stand-in)
        self.root = root  # the driver root it runs chrooted in (kubeletplugin/strategies/mps/root.py); None: here

    def _env(self, gpu_uuid: str, pipe: str | None = None) -> dict[str, str]:
        folders = {mpslayout.PIPE_ENV: pipe or mpslayout.pipe_dir(self.state_dir, gpu_uuid),
                   mpslayout.LOG_ENV: mpslayout.log_dir(self.state_dir, gpu_uuid),
                   mpslayout.CONTROL_DIR_ENV: mpslayout.control_dir(self.state_dir, gpu_uuid)}
        if self.root is None:
            return {**os.environ, "CUDA_VISIBLE_DEVICES": gpu_uuid, **folders}
        # in the driver root: its own PATH, the folders where mpsroot binds them, nothing of ours
        gpu = mpslayout.gpu_dir(self.state_dir, gpu_uuid)
        return {"PATH": ROOT_PATH, "CUDA_VISIBLE_DEVICES": gpu_uuid,
                **{k: mpsroot.IN_ROOT + v.removeprefix(gpu) for k, v in folders.items()}}

    def _argv(self, gpu_uuid: str, *args: str) -> list[str]:
        if self.root is None:
            return [*self.control, *args]
        return [sys.executable, mpsroot.__file__, "--root", self.root,
                "--gpu-dir", mpslayout.gpu_dir(self.state_dir, gpu_uuid), "--", *self.control, *args]

    def _endpoint(self, gpu_uuid: str) -> str:
        """The folder whose socket takes the plugin's commands: the control folder where the
        daemon listens there, else the pipe folder."""
        control = mpslayout.control_dir(self.state_dir, gpu_uuid)
        try:
            if stat.S_ISSOCK(os.lstat(os.path.join(control, mpslayout.SOCKET)).st_mode):
                return control
        except OSError:
            pass
        return mpslayout.pipe_dir(self.state_dir, gpu_uuid)

    def check_peer(self, gpu_uuid: str, folder: str) -> None:
        """The process that accepts on `folder`'s socket is the GPU's control daemon."""
        daemon = mpslayout.read_pid(self.state_dir, gpu_uuid)
        try:
            _check_folder(folder)
            if not stat.S_ISSOCK(os.lstat(os.path.join(folder, mpslayout.SOCKET)).st_mode):
                raise MpsError(f"{os.path.join(folder, mpslayout.SOCKET)} is not a socket")
            dirfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(CONNECT_TIMEOUT_S)
                try:  # by the folder's descriptor: no name on the way can be swapped for a link
                    conn.connect(f"/proc/self/fd/{dirfd}/{mpslayout.SOCKET}")
                finally:
                    os.close(dirfd)
                pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                  struct.calcsize("3i")))
        except OSError as e:
            raise MpsError(f"MPS control of GPU {gpu_uuid}: {e}") from None
        if pid != daemon or uid not in (0, os.geteuid()) or not mpslayout.daemon_alive(pid):
            raise MpsError(f"MPS control of GPU {gpu_uuid}: {folder}/{mpslayout.SOCKET} is answered by pid {pid} "
                           f"(user {uid}), not the control daemon (pid {daemon}, its pid file); nothing sent")

    def command(self, gpu_uuid: str, *lines: str) -> list[str]:
        """Send commands as `echo <command> | nvidia-cuda-mps-control` does, once the daemon is
        checked to be the one answering; the daemon's replies."""
        folder = self._endpoint(gpu_uuid)
        self.check_peer(gpu_uuid, folder)
        try:
            out = subprocess.run(self._argv(gpu_uuid), input="".join(f"{line}\n" for line in lines),
                                 env=self._env(gpu_uuid, folder), capture_output=True, text=True,
                                 timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MpsError(f"MPS control of GPU {gpu_uuid}: {e}") from None
        if out.returncode != 0:
            raise MpsError(f"MPS control of GPU {gpu_uuid}: {' '.join(lines)!r} failed: "
                           f"{(out.stderr or out.stdout).strip()[:300]}")
        return out.stdout.splitlines()

    def daemon_pid(self, gpu_uuid: str) -> int | None:
        """The GPU's live control daemon, by its pid file; None: none runs."""
        pid = mpslayout.read_pid(self.state_dir, gpu_uuid)
        return pid if mpslayout.daemon_alive(pid) else None

    def running(self, gpu_uuid: str) -> bool:
        return self.daemon_pid(gpu_uuid) is not None

    def ensure(self, gpu_uuid: str) -> None:
        """The GPU's control daemon is up: found (a plugin restart, the other instance of an
        upgrade) or started (the first MPS claim, after a reboot, or after it ended)."""
        if self.running(gpu_uuid):
            return
        gpu = mpslayout.gpu_dir(self.state_dir, gpu_uuid)
        for folder, mode in ((gpu, 0o755), (mpslayout.pipe_dir(self.state_dir, gpu_uuid), 0o755),
                             (mpslayout.log_dir(self.state_dir, gpu_uuid), 0o700),
                             (mpslayout.control_dir(self.state_dir, gpu_uuid), 0o700)):
            os.makedirs(folder, mode=mode, exist_ok=True)
            os.chmod(folder, mode, follow_symlinks=False)
            _check_folder(folder)
        if self.root is not None:  # the daemon's /dev/shm, its clients' too: any user's server writes there
            shm = mpslayout.shm_dir(self.state_dir, gpu_uuid)
            os.makedirs(shm, exist_ok=True)
            if not tmpfs.mount(shm, f"size={SHM_SIZE},mode=1777"):
                raise MpsError(f"the MPS /dev/shm of GPU {gpu_uuid}: not allowed to mount its tmpfs (the plugin "
                               "runs privileged on GPU nodes)")
            os.chmod(shm, 0o1777, follow_symlinks=False)
        try:
            os.unlink(mpslayout.stopping(self.state_dir, gpu_uuid))
        except FileNotFoundError:
            pass
        for folder in (mpslayout.pipe_dir(self.state_dir, gpu_uuid), mpslayout.control_dir(self.state_dir, gpu_uuid)):
            _clear(folder)  # what a daemon that died left (a node reboot, a kill): its sockets, its pid file
        try:  # -d: the daemon detaches, so it outlives this process
            out = subprocess.run(self._argv(gpu_uuid, "-d"), env=self._env(gpu_uuid), capture_output=True,
                                 text=True, timeout=START_TIMEOUT_S)
        except FileNotFoundError:
            raise MpsError(f"starting the MPS control daemon of GPU {gpu_uuid}: --mps-control {self.control[0]!r} "
                           "not found in the plugin's container; set --driver-root to the driver's root, whose "
                           "bin has NVIDIA's daemon (docs/strategies.md, \"On GPU nodes\")") from None
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MpsError(f"starting the MPS control daemon of GPU {gpu_uuid}: {e}") from None
        deadline = time.monotonic() + START_TIMEOUT_S
        while out.returncode == 0 and not self.running(gpu_uuid) and time.monotonic() < deadline:
            time.sleep(0.02)  # the real -d returns before the daemon has written its pid file
        if out.returncode != 0 or not self.running(gpu_uuid):
            raise MpsError(f"starting the MPS control daemon of GPU {gpu_uuid}: "
                           f"{(out.stderr or out.stdout).strip() or 'it wrote no pid file'}")
        log.info("MPS control daemon started", gpu=gpu_uuid, pid=self.daemon_pid(gpu_uuid),
                 pipe=mpslayout.pipe_dir(self.state_dir, gpu_uuid))

    def apply(self, gpu_uuid: str, gpus: Iterable[PreparedGpu]) -> None:
        """Set the server limits for the GPU's MPS claims (`gpus`: each claim's limits on it),
        for servers started later and for the running ones; with no claim left, stop the daemon."""
        gpus = list(gpus)
        if not gpus:
            self.stop(gpu_uuid)
            return
        self.ensure(gpu_uuid)
        threads = max(g.compute_limit for g in gpus)
        pinned = mpslayout.mebibytes(max(g.memory_limit for g in gpus))
        lines = [f"{mpslayout.SET_DEFAULT_THREADS} {threads}", f"{mpslayout.SET_DEFAULT_PINNED} 0 {pinned}"]
        for pid in self.command(gpu_uuid, mpslayout.GET_SERVERS):
            if pid.strip().isdigit():
                lines += [f"{mpslayout.SET_THREADS} {pid.strip()} {threads}",
                          f"{mpslayout.SET_PINNED} {pid.strip()} 0 {pinned}"]
        for reply in self.command(gpu_uuid, *lines):
            if reply.startswith("Error"):
                raise MpsError(f"MPS control of GPU {gpu_uuid}: {reply}")
        log.info("MPS limits set", gpu=gpu_uuid, claims=len(gpus), active_thread_percentage=threads,
                 pinned_memory=pinned)

    def stop(self, gpu_uuid: str) -> None:
        """Quit the daemon (the GPU's last MPS claim went) and remove its folders. The agent is
        told it is the plugin's doing first (mpslayout.STOPPING). A daemon that does not take the
        quit is ended by its pid."""
        gpu = mpslayout.gpu_dir(self.state_dir, gpu_uuid)
        pid = self.daemon_pid(gpu_uuid)
        if pid is not None:
            with open(os.open(mpslayout.stopping(self.state_dir, gpu_uuid),
                              os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "w") as f:
                f.write(f"{pid}\n")
            try:
                self.command(gpu_uuid, mpslayout.QUIT)
                log.info("MPS control daemon stopped", gpu=gpu_uuid, pid=pid)
            except MpsError as e:
                log.warning("MPS control daemon did not take quit; ending it", gpu=gpu_uuid, pid=pid, error=str(e))
            deadline = time.monotonic() + COMMAND_TIMEOUT_S
            while mpslayout.daemon_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if mpslayout.daemon_alive(pid):
                os.kill(pid, signal.SIGKILL)
        tmpfs.unmount(mpslayout.shm_dir(self.state_dir, gpu_uuid))
        shutil.rmtree(gpu, ignore_errors=True)
