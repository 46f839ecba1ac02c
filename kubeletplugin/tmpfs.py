"""Size-limited tmpfs mounts for the files a tenant can write (docs/security.md, "Files a tenant
can write"): what a container writes there is memory charged to its own cgroup, at most the
mount's size, never the node's state disk. The plugin mounts them in its own mount namespace,
which the DaemonSet's Bidirectional state-dir mount shares with the host's container runtime."""

from __future__ import annotations

import ctypes
import errno
import os

_libc = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MNT_DETACH = 2, 4, 8, 2


def mount(path: str, options: str) -> bool:
    """A tmpfs at `path` (a folder) with `options` (`size=...` and the like), nosuid, nodev,
    noexec; kept when one is there already (a restart). False: not allowed to mount (a plugin
    that is not root); any other failure is an OSError naming the path."""
    if os.path.ismount(path):
        return True
    if _libc.mount(b"gpushare", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                   options.encode()) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EPERM:
        return False
    raise OSError(err, f"mounting a tmpfs ({options}): {os.strerror(err)}", path)


def unmount(path: str) -> None:
    """Detach what is mounted at `path` (processes that still use it keep it until they end);
    nothing mounted there: nothing to do."""
    while os.path.ismount(path):
        if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unmounting: {os.strerror(err)}", path)
