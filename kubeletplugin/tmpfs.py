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


def seen_by_host(path: str) -> bool:
    """Whether a mount made at `path` reaches the container runtime, which resolves the CDI spec's
    mount sources in its own mount namespace: this process is in the host's (its init's, in view
    with hostPID), or `path` is on this namespace's root mount (the plugin runs where the runtime
    does: a host process), or the mount it is under is shared (a Bidirectional volume on a shared
    host mount). A plugin whose state dir is a private or slave volume would mount a tmpfs the
    runtime never sees, and containers would get the empty folder under it."""
    try:
        if os.readlink("/proc/self/ns/mnt") == os.readlink("/proc/1/ns/mnt"):
            return True
    except OSError:  # (init out of reach: a sandbox's)
        pass
    try:
        with open("/proc/self/mountinfo") as f:
            table = [line.split() for line in f]
    except OSError:
        return False
    real = os.path.realpath(path)
    best: list[str] | None = None
    for fields in table:
        point = fields[4].replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and \
                (best is None or len(point) >= len(best[4])):
            best = fields
    if best is None:
        return False
    return best[4] == "/" or any(f.startswith("shared:") for f in best[6:best.index("-")])


def mount(path: str, options: str) -> bool:
    """A tmpfs at `path` (a folder) with `options` (`size=...` and the like), nosuid, nodev,
    noexec; kept when one is there already (a restart). False: not allowed to mount (a plugin
    that is not root), or a mount there would not reach the host (seen_by_host); any other
    failure is an OSError naming the path."""
    if os.path.ismount(path):
        return True
    if not seen_by_host(path):
        return False
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
