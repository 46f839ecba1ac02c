"""NodeState: where the plugin keeps what it prepares on this node, opened once at start-up
(main.py) and given to the Driver: the claims' folders, their CDI specs, the checkpoint, and the
lock by which plugin instances sharing the state folder (a rolling upgrade) take turns."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cdi import SpecDir

from . import checkpoint as ckpt
from .cdispec import KIND
from .claimfiles import ClaimFiles
from .instances import CallLock

SYSTEM_CDI_DIR = "/etc/cdi"  # where the NVIDIA container toolkit writes its specs


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


@dataclass(frozen=True)
class NodeState:
    state_dir: str
    files: ClaimFiles
    specs: SpecDir
    cdi_dirs: tuple[str, ...]  # every folder of CDI specs, ours and the toolkit's
    checkpoint: ckpt.Checkpoint
    calls: CallLock

    @classmethod
    def open(cls, state_dir: str, cdi_root: str, system_cdi_dirs: tuple[str, ...] = (SYSTEM_CDI_DIR,)) -> NodeState:
        state_dir, cdi_root = os.path.abspath(state_dir), os.path.abspath(cdi_root)
        checkpoint = ckpt.Checkpoint(os.path.join(state_dir, "checkpoint.json"), boot_id())
        return cls(state_dir, ClaimFiles(state_dir), SpecDir(cdi_root, KIND), (*system_cdi_dirs, cdi_root), checkpoint,
                   CallLock(state_dir, on_take=checkpoint.reload_if_changed, on_handover=checkpoint.compact))
