"""Crash-safe file replacement: a reader sees the old file or the new one, never a mix.

Write a temporary file in the same folder, fsync it, rename it over the target, fsync the
folder (so the rename itself survives a power loss). Used for CDI specs and the kubelet
plugin's checkpoint.

The temporary is `.<target>.<random>.tmp`: a process killed before the rename leaves it
behind, and CDI loaders (podman, containerd: container-device-interface's scanSpecDirs)
load every `*.json` / `*.yaml` file of a spec folder, dot-files included, so it must not end
in either. `remove_temp_files` clears them at start-up.
"""

from __future__ import annotations

import os
import re
import tempfile

TEMP_SUFFIX = ".tmp"
# ours, and the `.tmp-<random>-<target>` of releases before this one (those ended in .json)
_TEMP = re.compile(r"\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp|\.tmp-[a-z0-9_]{8}-(?P<old_target>.+)")


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=TEMP_SUFFIX)
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600; set the final mode before it becomes visible
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(folder)


def remove_durable(path: str) -> bool:
    """Remove a file and fsync its folder; False when it was not there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    return True


def fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temp_files(folder: str, target_prefix: str = "") -> list[str]:
    """Remove the temporaries an interrupted write_atomic left in `folder` for targets whose
    name starts with `target_prefix`; return their names. Only one writer may use the
    folder's targets (the plugin calls this before it serves)."""
    try:
        entries = os.listdir(folder)
    except FileNotFoundError:
        return []
    removed = []
    for entry in entries:
        m = _TEMP.fullmatch(entry)
        if m and (m.group("target") or m.group("old_target")).startswith(target_prefix):
            try:
                os.unlink(os.path.join(folder, entry))
                removed.append(entry)
            except FileNotFoundError:
                pass
    if removed:
        fsync_dir(folder)
    return removed
