"""A prepared claim's files under --state-dir (docs/interfaces.md is the contract):

    claims/                      0700
    claims/<uid>/                0700: no other host user reaches the files below
    claims/<uid>/limits          0444: the authoritative limits (limits file format v1)
    claims/<uid>/region/         the claim's own tmpfs, as large as its regions (0700)
    claims/<uid>/region/<i>      0666: usage region of the container's GPU i, 1 MiB of zeros
    claims/<uid>/control-<i>     0644: the node agent's control file of GPU i, 4 KiB of zeros
    claims/<uid>/ld.so.preload   0444: the library's container path, mounted at /etc/ld.so.preload
    claims/<uid>/prepared.json   0600: what Prepare answered (rebuilds a lost checkpoint)

A claim with sharingStrategy None gets its folder and prepared.json only: nothing is injected.

Containers reach their files through bind mounts of the files themselves, which do not
traverse the folders: the region stays 0666 so a container of any UID (or user namespace)
can map it, while the 0700 folders keep every other host user out.

The regions are the only files of the folder a container can write, so they live on a tmpfs of
their own, sized to hold them and nothing more (`size` = count x REGION_SIZE): a tenant that
grows its region writes into memory charged to its own cgroup, at most that much, never onto
the node's state disk (docs/security.md, "Files a tenant can write"). A tmpfs is gone after a
reboot, when the regions are zeroed anyway: start-up mounts it again (`repair`). A claim
prepared by an older release keeps its `region-<i>` file on the state disk until it is unprepared.
"""

from __future__ import annotations

import json
import os
import shutil

from cdi import fsync_dir, remove_durable, remove_temp_files, write_atomic
from dra_driver.config import MPS
from dra_driver.log import get_logger
from kubeletplugin.hooklayout import CONTROL_SIZE, REGION_SIZE

from . import tmpfs
from .claimref import UID
from .prepared import PreparedClaim, PreparedError

log = get_logger("claimfiles")

LIMITS_VERSION = 1
CONTAINER_LIBRARY = "/usr/local/gpushare/lib/libgpushare.so"
FOLDER_MODE = 0o700
PREPARED = "prepared.json"
REGION_DIR = "region"


def limits_text(claim: PreparedClaim) -> str:
    lines = ["# gpushare limits: written by the kubelet plugin, read by libgpushare.so",
             f"GPUSHARE_LIMITS_VERSION={LIMITS_VERSION}", f"GPUSHARE_CLAIM_UID={claim.uid}",
             f"GPUSHARE_GPU_COUNT={len(claim.gpus)}"]
    if claim.sharing_strategy == MPS:  # the library paces the claim in SM-time (hook/src/pacing.c, mps_scale)
        lines.append(f"GPUSHARE_SHARING_STRATEGY={MPS}")
    for i, gpu in enumerate(claim.gpus):
        lines += [f"GPUSHARE_DEVICE_UUID_{i}={gpu.uuid}", f"GPUSHARE_MEMORY_LIMIT_{i}={gpu.memory_limit}",
                  f"GPUSHARE_COMPUTE_LIMIT_{i}={gpu.compute_limit}",
                  f"GPUSHARE_COMPUTE_POLICY_{i}={gpu.compute_policy}"]
        if gpu.sm_count:
            lines.append(f"GPUSHARE_SM_COUNT_{i}={gpu.sm_count}")
    return "\n".join(lines) + "\n"


def file_names(claim: PreparedClaim) -> list[str]:
    """The files of a prepared claim's folder."""
    if not claim.injects_library:
        return [PREPARED]
    return ["limits", "ld.so.preload", PREPARED, *(f"control-{i}" for i in range(len(claim.gpus))),
            *(f"{REGION_DIR}/{i}" for i in range(len(claim.gpus)))]


class ClaimFiles:
    def __init__(self, state_dir: str):
        self.root = os.path.join(state_dir, "claims")

    def setup(self) -> None:
        _mkdir(os.path.dirname(self.root), 0o711)
        _mkdir(self.root, FOLDER_MODE)

    def dir(self, uid: str) -> str:
        assert UID.fullmatch(uid), uid  # callers validate; this keeps every path inside root
        return os.path.join(self.root, uid)

    def limits_path(self, uid: str) -> str:
        return os.path.join(self.dir(uid), "limits")

    def region_path(self, uid: str, i: int) -> str:
        legacy = os.path.join(self.dir(uid), f"region-{i}")  # prepared by an older release
        return legacy if os.path.lexists(legacy) else os.path.join(self.dir(uid), REGION_DIR, str(i))

    def control_path(self, uid: str, i: int) -> str:
        return os.path.join(self.dir(uid), f"control-{i}")

    def preload_path(self, uid: str) -> str:
        return os.path.join(self.dir(uid), "ld.so.preload")

    def write(self, claim: PreparedClaim) -> None:
        """Create the claim's files. Existing regions and control files are kept as they are
        (never re-zeroed: running processes map them)."""
        uid = claim.uid
        folder = self.dir(uid)
        _mkdir(folder, FOLDER_MODE)
        if claim.injects_library:
            write_atomic(self.limits_path(uid), limits_text(claim).encode(), mode=0o444)
            write_atomic(self.preload_path(uid), (CONTAINER_LIBRARY + "\n").encode(), mode=0o444)
            if not os.path.lexists(os.path.join(folder, "region-0")):
                _mount_regions(os.path.join(folder, REGION_DIR), len(claim.gpus))
            for i in range(len(claim.gpus)):
                _create_zeroed(self.region_path(uid, i), REGION_SIZE, 0o666)
                _create_zeroed(self.control_path(uid, i), CONTROL_SIZE, 0o644)
        write_atomic(os.path.join(folder, PREPARED), json.dumps(claim.to_json()).encode(), mode=0o600)
        fsync_dir(folder)

    def repair(self, claim: PreparedClaim) -> bool:
        """Start-up: rewrite a prepared claim's missing files (regions kept), clear temporaries
        of interrupted writes, tighten an older release's folder mode. True when files were missing."""
        folder = self.dir(claim.uid)
        names = file_names(claim)
        if os.path.lexists(os.path.join(folder, "region-0")):  # an older release's layout
            names = [f"region-{n.rpartition('/')[2]}" if n.startswith(REGION_DIR) else n for n in names]
        remove_temp_files(folder)
        if all(os.path.exists(os.path.join(folder, n)) for n in names):
            os.chmod(folder, FOLDER_MODE)
            return False
        self.write(claim)
        return True

    def read_prepared(self, uid: str) -> PreparedClaim | None:
        """The recorded answer; None when there is none. PreparedError when it is not whole or
        not this claim's."""
        try:
            with open(os.path.join(self.dir(uid), PREPARED), "rb") as f:
                data = f.read()
        except OSError:
            return None
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise PreparedError(f"{PREPARED}: not JSON ({e})") from None
        claim = PreparedClaim.from_json(doc, PREPARED)
        if claim.uid != uid:
            raise PreparedError(f"{PREPARED}.uid: not the uid of its folder (got {claim.uid!r})")
        return claim

    def exists(self, uid: str) -> bool:
        return os.path.isdir(self.dir(uid))

    def remove(self, uid: str) -> bool:
        folder = self.dir(uid)
        if not os.path.lexists(folder):
            return False
        # The record first: a removal cut short never leaves a folder that start-up would adopt.
        remove_durable(os.path.join(folder, PREPARED))
        unmount_regions(folder)
        shutil.rmtree(folder)
        fsync_dir(self.root)
        return True

    def uids(self) -> set[str]:
        """Claim folders on disk (anything not named like a UID is left alone)."""
        try:
            return {e for e in os.listdir(self.root) if UID.fullmatch(e)}
        except FileNotFoundError:
            return set()

    def reset_regions(self, uid: str, count: int) -> None:
        """Zero the regions (after a reboot no process can still hold usage in them) and the
        control files (a rate from the old boot is stale until the agent measures again)."""
        for i in range(count):
            if not os.path.exists(self.region_path(uid, i)):  # sharingStrategy None: no region
                continue
            _zero(self.region_path(uid, i), REGION_SIZE)
            if os.path.exists(self.control_path(uid, i)):  # absent: prepared by an older plugin
                _zero(self.control_path(uid, i), CONTROL_SIZE)


def _mount_regions(path: str, count: int) -> None:
    """The claim's region tmpfs at `path`: room for its `count` regions and no more, one inode
    each (plus the folder's). Already mounted (a restart): kept, with what is in it. Not allowed
    to mount (a plugin that is not root: a playground or a test as a user), or a mount there would
    not reach the container runtime (a state dir that is not a shared mount, tmpfs.seen_by_host):
    the folder stays on the state disk, said once in the log."""
    global _warned_no_mount
    _mkdir(path, FOLDER_MODE)
    if not tmpfs.mount(path, f"size={count * REGION_SIZE},nr_inodes={count + 1},mode=0700,huge=never") \
            and not _warned_no_mount:
        _warned_no_mount = True
        log.warning("cannot mount the regions' tmpfs where the container runtime sees it (not root, or the "
                    "state dir is not a shared mount: mountPropagation Bidirectional on a shared host mount, "
                    "docs/operations.md): regions are on the state disk, where a tenant can grow them", path=path)


_warned_no_mount = False


def unmount_regions(folder: str) -> None:
    """Detach a claim folder's region tmpfs (containers that still map a region keep their own
    mount of it until they end)."""
    tmpfs.unmount(os.path.join(folder, REGION_DIR))


def unmount_all_regions(state_dir: str) -> None:
    """Detach the region tmpfs of every claim folder under `state_dir` (before removing it: an
    uninstall, a playground's or a test's state dir)."""
    claims = os.path.join(state_dir, "claims")
    for uid in os.listdir(claims) if os.path.isdir(claims) else []:
        unmount_regions(os.path.join(claims, uid))


def _zero(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        os.ftruncate(f.fileno(), 0)
        os.ftruncate(f.fileno(), size)
        os.fsync(f.fileno())


def _create_zeroed(path: str, size: int, mode: int) -> None:
    """Create path as `size` zero bytes with `mode`; an existing file of that size is kept as is."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)  # a sparse file of zeros
        os.fchmod(fd, mode)  # not subject to the umask
        os.fsync(fd)
    finally:
        os.close(fd)


def _mkdir(path: str, mode: int) -> None:
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    os.chmod(path, mode)  # mkdir's mode is filtered by the umask
