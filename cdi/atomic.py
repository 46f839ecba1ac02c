"""Crash-safe file replacement: a reader sees the old file or the new one, never a mix.

Write a temporary file in the same folder, fsync it, rename it over the target, fsync the
folder (so the rename itself survives a power loss). Used for CDI specs and the kubelet
plugin's checkpoint.
"""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix="-" + os.path.basename(path))
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
