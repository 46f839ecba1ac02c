"""The GPUs' MPS control daemons, run by the plugin on the host side (docs/strategies.md).

One nvidia-cuda-mps-control daemon per GPU serves every claim on that GPU that chose
sharingStrategy MPS (their kernels run side by side in one server); a claim that did not choose
MPS never gets the GPU's pipe folder, so it never joins that server. The plugin starts a daemon
with the first MPS claim of its GPU (`-d`: it outlives a plugin restart or upgrade, found again
through its pipe folder), tells it the limits after every Prepare and Unprepare of an MPS claim,
and stops it (`quit`) with the last. After a node reboot, recovery starts it again.

Limits go through the daemon's stdin protocol (the real command names, mpslayout): MPS sets
limits per server, not per client, so the trusted ceiling is the largest compute share and
memory budget among the GPU's MPS claims; each client's own share reaches it as
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, which MPS lets a client
lower, never raise past the server's. Equal shares (partition mode) make the ceiling each
claim's share exactly; the library still holds each claim's memory budget, and holds the
claim's processes together to its compute share in SM-time (hook/src/hook.c, mps_scale).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence

from dra_driver.log import get_logger
from kubeletplugin import mpslayout

from .prepared import PreparedGpu

log = get_logger("kubeletplugin.mps")

COMMAND_TIMEOUT_S = 10.0
MPS_CONTROL = "nvidia-cuda-mps-control"  # --mps-control: found on PATH (the driver root's bin)


class MpsError(RuntimeError):
    """The control daemon could not be reached or refused a command."""


class MpsControl:
    def __init__(self, state_dir: str, control: Sequence[str]) -> None:
        self.state_dir = state_dir
        self.control = list(control)  # argv of nvidia-cuda-mps-control (or a stand-in)

    def _env(self, gpu_uuid: str) -> dict[str, str]:
        return {**os.environ, "CUDA_VISIBLE_DEVICES": gpu_uuid,
                mpslayout.PIPE_ENV: mpslayout.pipe_dir(self.state_dir, gpu_uuid),
                mpslayout.LOG_ENV: mpslayout.log_dir(self.state_dir, gpu_uuid)}

    def command(self, gpu_uuid: str, *lines: str) -> list[str]:
        """Send commands as `echo <command> | nvidia-cuda-mps-control` does; the daemon's replies."""
        try:
            out = subprocess.run(self.control, input="".join(f"{line}\n" for line in lines), env=self._env(gpu_uuid),
                                 capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MpsError(f"MPS control of GPU {gpu_uuid}: {e}") from None
        if out.returncode != 0:
            raise MpsError(f"MPS control of GPU {gpu_uuid}: {' '.join(lines)!r} failed: "
                           f"{(out.stderr or out.stdout).strip()[:300]}")
        return out.stdout.splitlines()

    def running(self, gpu_uuid: str) -> bool:
        try:
            self.command(gpu_uuid, mpslayout.GET_SERVERS)
            return True
        except MpsError:
            return False

    def ensure(self, gpu_uuid: str) -> None:
        """The GPU's control daemon is up: found (a plugin restart, the other instance of an
        upgrade) or started (the first MPS claim, or after a reboot)."""
        if self.running(gpu_uuid):
            return
        for folder in (mpslayout.pipe_dir(self.state_dir, gpu_uuid), mpslayout.log_dir(self.state_dir, gpu_uuid)):
            os.makedirs(folder, mode=0o755, exist_ok=True)
        try:  # -d: the daemon detaches, so it outlives this process
            out = subprocess.run([*self.control, "-d"], env=self._env(gpu_uuid), capture_output=True, text=True,
                                 timeout=COMMAND_TIMEOUT_S)
        except FileNotFoundError:
            raise MpsError(f"starting the MPS control daemon of GPU {gpu_uuid}: --mps-control {self.control[0]!r} "
                           "not found in the plugin's container; the deployed plugin does not run NVIDIA's daemon "
                           "yet (docs/strategies.md, \"On GPU nodes\")") from None
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MpsError(f"starting the MPS control daemon of GPU {gpu_uuid}: {e}") from None
        if out.returncode != 0 or not self.running(gpu_uuid):
            raise MpsError(f"starting the MPS control daemon of GPU {gpu_uuid}: {(out.stderr or out.stdout).strip()}")
        log.info("MPS control daemon started", gpu=gpu_uuid, pipe=mpslayout.pipe_dir(self.state_dir, gpu_uuid))

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
        self.command(gpu_uuid, f"{mpslayout.SET_DEFAULT_THREADS} {threads}",
                     f"{mpslayout.SET_DEFAULT_PINNED} 0 {pinned}")
        for pid in self.command(gpu_uuid, mpslayout.GET_SERVERS):
            if pid.strip().isdigit():
                self.command(gpu_uuid, f"{mpslayout.SET_THREADS} {pid.strip()} {threads}",
                             f"{mpslayout.SET_PINNED} {pid.strip()} 0 {pinned}")
        log.info("MPS limits set", gpu=gpu_uuid, claims=len(gpus), active_thread_percentage=threads,
                 pinned_memory=pinned)

    def stop(self, gpu_uuid: str) -> None:
        if self.running(gpu_uuid):
            self.command(gpu_uuid, mpslayout.QUIT)
            log.info("MPS control daemon stopped", gpu=gpu_uuid)
        shutil.rmtree(mpslayout.gpu_dir(self.state_dir, gpu_uuid), ignore_errors=True)
