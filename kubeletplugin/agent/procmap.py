"""Which claim does a host process belong to, and what is its container?

Only from what the kernel and the API server say, never from a path inside the container or
anything a tenant can write (docs/security.md, "The trusted layer"):

1. The process's cgroup (/proc/<pid>/cgroup, written by the kernel; a tenant cannot leave its
   cgroup). The kubelet names each pod's cgroup after the pod's UID (`pod<uid>`, `_` for `-`
   under systemd), and each ResourceClaim's `status.reservedFor` (written by the scheduler)
   lists the UIDs of the pods that use it: pod UID -> claim. Neither chroot, a private mount
   namespace, nor an image layout changes it. Only the kubelet's own layout counts (`layout`):
   the pod is the component right under the kubepods root (and its QoS class), the container
   the one below it; a tenant that may make sub-cgroups of its container (delegation, a
   privileged pod) can name one `pod<another pod's uid>`, which is deeper and so never read:
   the process stays its own pod's, and its container is killed whole. A pod that holds several
   of our claims (one per container) is resolved to the container: the container ID of that
   component against the pod's status.containerStatuses, and the container's resources.claims
   in its spec (the agent reads the pod; the API server's word, like reservedFor).
   Every fact is read from a live thread (`live`): a process whose main thread has exited
   (a zombie leader) shows `/` as its cgroup, and no mount table or environment, at /proc/<pid>.
2. Outside kubelet pods (podman, tests), or before the pod is read: the process's mount table
   (/proc/<pid>/mountinfo, written by the kernel). The claim's limits file reaches the
   container as a bind mount whose source shows there as (device, path in that filesystem) =
   `<state-dir>/claims/<uid>/limits` on the host, wherever the image puts its mount point
   (`/var/run` a link to `/run` included). The agent computes the same pair from its own
   mount table. A tenant cannot create a bind mount of a file it cannot reach,
   so it can only hide this (chroot, a new mount namespace), never point it at another claim.
3. Host processes only (root = the agent's root: tests, ProcessRunner, hack scripts using the
   library's GPUSHARE_RUN_DIR mode): $GPUSHARE_RUN_DIR/limits matched by inode, else the pids
   the claims' region slots record in the agent's own pid namespace (checked against the start
   time, so a reused pid does not match).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import select
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Collection

    from .regions import Slot

CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
_ESCAPE = re.compile(r"\\([0-7]{3})")
T = TypeVar("T")


@dataclass(frozen=True)
class Owner:
    uid: str                  # the claim
    pod: str | None           # pod UID from the cgroup (None outside kubelet pods)
    cgroup: str | None        # /proc/<pid>/cgroup text: the container; None for host processes


def _key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _read(path: str) -> str | None:
    data = _read_bytes(path)
    return data.decode(errors="replace") if data is not None else None


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat_field(pid: int, field: int) -> int | None:
    """Numeric field `field` (1-based, as in proc(5)) of /proc/<pid>/stat; None when it is gone.
    Fields are counted after the command name, which may itself hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[field - 3])


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), as the library records it."""
    return _stat_field(pid, 22)


def slot_key(pid: int) -> tuple[int, int, int] | None:
    """(pid namespace inode, pid in that namespace, start time) of a host pid: what the library
    writes into the usage slot it takes, so a slot with this key is this process's. None when the
    process is gone."""
    status = _read(f"/proc/{pid}/status")
    ns = _key(f"/proc/{pid}/ns/pid")
    started = start_time(pid)
    if status is None or ns is None or started is None:
        return None
    nspid = next((line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:")), str(pid))
    return ns[1], int(nspid), started


def _exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])  # a pidfd is readable once its process has exited


PF_EXITING = 0x4  # the task flag do_exit() sets first, before the task leaves its namespaces
V1_AT_ROOT = re.compile(r"^[0-9]+:[^:\n]+:/$", re.M)  # a cgroup v1 hierarchy's line at its root
LIVE_ROUNDS = 20  # times the thread list is read again while its threads come and go


def _exiting_at(at: str) -> bool:
    """The task of a /proc folder (a process's or a thread's) has begun to exit (PF_EXITING,
    field 9 of its stat), or is gone."""
    try:
        with open(f"{at}/stat", "rb") as f:
            data = f.read()
        return bool(int(data[data.rindex(b")") + 2:].split()[6]) & PF_EXITING)
    except (OSError, ValueError, IndexError):
        return True


def exiting(pid: int) -> bool:
    """The process has begun to exit (PF_EXITING, field 9 of /proc/<pid>/stat), or is gone. From
    then on its cgroup v1 paths read as the root (the kernel shows exiting tasks there; v2 keeps
    the path) while its mount table still reads as its container's. (Only the leader's flag: a
    process whose main thread exited and whose other threads run on keeps its v2 mapping.)"""
    return _exiting_at(f"/proc/{pid}")


def _threads(pid: int) -> Iterator[str]:
    """/proc/<pid>, then /proc/<pid>/task/<tid> of its other threads, newest first (in a
    process whose threads replace each other the newest is the likeliest to live)."""
    yield f"/proc/{pid}"
    try:
        tids = sorted((int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit() and int(t) != pid), reverse=True)
    except OSError:
        return
    for tid in tids:
        yield f"/proc/{pid}/task/{tid}"


def live(pid: int, read: Callable[[str], T]) -> tuple[str | None, T]:
    """(folder, read(folder)) of a thread of pid that had not begun to exit when read: the main
    thread's /proc/<pid> while it lives, else another thread's /proc/<pid>/task/<tid>. A main
    thread that called pthread_exit is a zombie until the last thread ends: /proc/<pid>/cgroup
    then reads `/` in every cgroup v1 hierarchy, and its mount table, environment and root are
    gone (issue 26, attack 2); and threads that keep replacing each other are often gone by the
    time their folder is read (issue 40). So each read is checked AFTER it is made: PF_EXITING is
    never cleared, so a thread not exiting after the read was not exiting during it; the thread
    list is read again (LIVE_ROUNDS times) until a read passes. None and what /proc/<pid> shows:
    every thread was exiting (the process is leaving)."""
    for _ in range(LIVE_ROUNDS):
        threads = _threads(pid)
        main = next(threads)
        value = read(main)
        if not _exiting_at(main):
            return main, value
        others = 0  # (the task list is read only now: the main thread was not live)
        for at in threads:
            others += 1
            value = read(at)
            if not _exiting_at(at):
                return at, value
        if not others:
            break
    return None, read(main)


QOS = ("burstable", "besteffort")
_UID_TEXT = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD_COMPONENT = re.compile(rf"(?:[a-z0-9-]*-)?pod({_UID_TEXT})(?:\.slice)?")
# cgroupfs driver: kubepods; systemd driver: kubepods.slice, or <root>-kubepods.slice under a
# --cgroup-root (kind: kubelet.slice/kubelet-kubepods.slice)
_KUBEPODS = re.compile(r"kubepods|(?:[a-z0-9-]*-)?kubepods\.slice")
KUBEPODS_DEPTH = 2  # the kubepods root is the first component, or the second under a --cgroup-root


def pod_path(path: str) -> tuple[str, list[str]] | None:
    """(pod UID, the path's components down to its container) of one cgroup path laid out by the
    kubelet: <cgroup root>/kubepods[/<qos>]/pod<uid>/<container> (cgroupfs) or
    [<root>-]kubepods.slice[/...-<qos>.slice]/...-pod<uid_>.slice/<container>.scope (systemd).
    The FIRST pod component under the kubepods root, never a deeper one: below the container's
    cgroup the names are the tenant's. A path relative to the reader's cgroup namespace
    (`/../../kubepods-pod<uid>.slice/...`) starts below the hidden kubepods root."""
    parts = [p for p in path.split("/") if p]
    ups = next((i for i, p in enumerate(parts) if p != ".."), len(parts))
    if ups:  # the kubepods root, if it shows at all, is the first component below the ".."
        at = ups + (ups < len(parts) and bool(_KUBEPODS.fullmatch(parts[ups])))
    else:
        root = next((i for i, p in enumerate(parts[:KUBEPODS_DEPTH]) if _KUBEPODS.fullmatch(p)), None)
        if root is None:
            return None
        at = root + 1
    if at < len(parts) and any(parts[at] == q or parts[at].endswith(f"-{q}.slice") for q in QOS):
        at += 1
    m = _POD_COMPONENT.fullmatch(parts[at]) if at < len(parts) else None
    return (m.group(1).replace("_", "-"), parts[:at + 2]) if m else None


def layout(cgroup: str) -> tuple[str, str | None, str] | None:
    """(pod UID, container component or None, the cgroup text cut at the container) of a
    /proc/<pid>/cgroup text in the kubelet's layout, or None. Every hierarchy that shows a pod
    must show the same one (else it is no kubelet layout: None); the cut text is the
    container's cgroup in each hierarchy, which the backstop kills whole (a tenant's deeper
    sub-cgroup included)."""
    pod = container = None
    lines = []
    for line in cgroup.splitlines():
        hierarchy, sep, path = line.rpartition(":")
        found = pod_path(path) if sep else None
        if found:
            uid, cut = found
            if pod is not None and uid != pod:
                return None
            pod = uid
            if not _POD_COMPONENT.fullmatch(cut[-1]):
                container = container or cut[-1]
            path = "/" + "/".join(cut)
        lines.append(f"{hierarchy}:{path}")
    if pod is None:
        return None
    return pod, container, "\n".join(lines) + "\n"


def pod_uid(cgroup: str) -> str | None:
    """The kubelet pod UID of a /proc/<pid>/cgroup text (its own pod, from the kubelet's layout), or None."""
    found = layout(cgroup)
    return found[0] if found else None


def container_id(cgroup: str) -> str | None:
    """The runtime's container ID of a /proc/<pid>/cgroup text: the container component of the
    kubelet's layout (never a deeper sub-cgroup's name), or None."""
    found = layout(cgroup)
    ids = CONTAINER_ID.findall(found[1]) if found and found[1] else []
    return ids[-1] if ids else None


def mounts(pid: int | str) -> list[tuple[str, str, str]]:
    """(major:minor, root in its filesystem, mount point) of each line of the mount table of a
    pid, "self", or a /proc folder (a thread's: `view`)."""
    text = _read(f"{pid}/mountinfo" if str(pid).startswith("/") else f"/proc/{pid}/mountinfo") or ""
    out = []
    for line in text.splitlines():
        f = line.split(" ")
        if len(f) > 4:
            out.append((f[2], _unescape(f[3]), _unescape(f[4])))
    return out


def _unescape(s: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), s)


def mount_source(path: str, table: list[tuple[str, str, str]] | None = None) -> tuple[str, str] | None:
    """(major:minor, path in its filesystem) of a host file: what a bind mount of it shows as
    its source in any process's mountinfo."""
    real = os.path.realpath(path)
    best = None
    for dev, root, point in table if table is not None else mounts("self"):
        if (real == point or real.startswith(point.rstrip("/") + "/")) and (best is None or len(point) > len(best[2])):
            best = (dev, root, point)
    if best is None:
        return None
    rel = os.path.relpath(real, best[2])
    return best[0], os.path.normpath(os.path.join(best[1], rel))


# a file mapping's line of /proc/<pid>/maps: its device and inode (0: anonymous)
_MAPPED_FILE = re.compile(rb"^[0-9a-f]+-[0-9a-f]+ \S+ [0-9a-f]+ ([0-9a-f]+:[0-9a-f]+) ([0-9]+) ", re.M)


def mapped_files(pid: int) -> set[tuple[str, int]]:
    """(device, inode) of each file a process maps, as /proc/<pid>/maps shows them, read from a
    live thread (`live`): the kernel's word, so a process cannot map a file and not show it (a
    hard link or a bind mount of the file shows the same pair, a copy another); empty when it is
    gone or unreadable (another user's process, to an agent not root)."""
    data = live(pid, lambda at: _read_bytes(f"{at}/maps"))[1]
    if data is None:
        return set()
    return {(dev.decode(), int(ino)) for dev, ino in _MAPPED_FILE.findall(data) if ino != b"0"}


def map_key(path: str) -> tuple[str, int] | None:
    """(device, inode) of the file at `path` as the maps of every process that maps it show it
    (`mapped_files`): the kernel prints the device of the file mapped, which is not always stat's
    st_dev (overlayfs maps the layer's file). Learnt from a private mapping of its first page,
    made a moment and never touched (a tenant can cut a region short: a touch could SIGBUS).
    None: it cannot be mapped."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), mmap.PAGESIZE, access=mmap.ACCESS_COPY) as m:
            byte = ctypes.c_char.from_buffer(m)  # (an export of the map: dropped at once, close still works)
            address = ctypes.addressof(byte)
            del byte
            with open("/proc/self/maps", "rb") as maps:
                for line in maps:
                    span, _, _, dev, ino = line.split(maxsplit=5)[:5]
                    start, _, end = span.partition(b"-")
                    if int(start, 16) <= address < int(end, 16):
                        return (dev.decode(), int(ino)) if ino != b"0" else None
    except (OSError, ValueError):
        pass
    return None


def _run_dir(at: str) -> str | None:
    try:
        with open(f"{at}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"GPUSHARE_RUN_DIR="):
            return os.fsdecode(item.split(b"=", 1)[1])
    return None


class ProcessMap:
    """Thread-safe: the agent's period and the backstop's poll both ask."""

    def __init__(self) -> None:
        self._root = _key("/")
        self._pidns = _key("/proc/self/ns/pid")
        self._cgroup = _read("/proc/self/cgroup")
        self._lock = threading.Lock()
        # uid -> (its limits file, the file's inode, its mount source): read once per claim
        self._limits_facts: dict[str, tuple[str, tuple[int, int] | None, tuple[str, str] | None]] = {}
        self._by_limits: dict[tuple[int, int], str] = {}   # inode of a limits file -> uid
        self._by_mount: dict[tuple[str, str], str] = {}    # its mount source -> uid
        self._by_pod: dict[str, list[str]] = {}            # pod UID -> uids reserved for it
        self._by_container: dict[str, str] = {}            # container ID -> uid (pods with several claims)
        self._by_slot: dict[tuple[int, int], str] = {}     # (pid, start_time) in our namespace -> uid
        self._cache: dict[tuple[int, int], Owner] = {}     # (pid, start_time) -> owner
        self._misses: dict[tuple[int, int], str] = {}      # (pid, start_time) -> its cgroup when it mapped nowhere
        self._known: dict[int, tuple[int, int]] = {}       # pid -> (pidfd, start_time) of a live process
        self._mapped: dict[int, Owner] = {}                # pid -> its cached owner, for known pids: one get each
        self.generation = 0                                # bumped by every change of _mapped
        self._pid_of_fd: dict[int, int] = {}
        # The known pidfds, each readable once its process has exited. epoll, not poll(2): a poll
        # that finds no exit costs the same for 128 processes as for none (poll(2) asked each).
        self._poller = select.epoll()
        self.unknown_pods: set[str] = set()                # pods on a GPU in no claim's reservedFor
        self.unresolved_pods: set[str] = set()             # pods with several claims, container unknown

    def update(self, limits_files: dict[str, str], slots: dict[str, list[Slot]],
               reserved: dict[str, set[str]] | None = None, containers: dict[str, str] | None = None) -> None:
        """limits_files: uid -> host limits path; slots: uid -> the region slots of the claim;
        reserved: uid -> UIDs of the pods in the claim's status.reservedFor; containers:
        container ID -> uid, for pods that hold several claims."""
        containers = containers or {}
        # A claim's limits file is written once, at its Prepare: its inode and mount source are
        # read when the claim is new, not at every update (the backstop updates after each Prepare).
        new = {uid: path for uid, path in limits_files.items()
               if uid not in self._limits_facts or self._limits_facts[uid][0] != path}
        if new:
            table = mounts("self")
            for uid, path in new.items():
                self._limits_facts[uid] = (path, _key(path), mount_source(path, table))
        self._limits_facts = {uid: f for uid, f in self._limits_facts.items() if uid in limits_files}
        by_limits = {k: uid for uid, (_, k, _) in self._limits_facts.items() if k}
        by_mount = {m: uid for uid, (_, _, m) in self._limits_facts.items() if m}
        by_pod: dict[str, list[str]] = {}
        for uid, pods in (reserved or {}).items():
            for pod in pods:
                by_pod.setdefault(pod, []).append(uid)
        ns = self._pidns[1] if self._pidns else None
        by_slot = {(s.pid, s.start_time): uid for uid, ss in slots.items() for s in ss if s.pidns == ns}
        with self._lock:
            if by_limits != self._by_limits or by_pod != self._by_pod or containers != self._by_container:
                self._cache.clear()  # a claim, a pod or a container came or went
                self._misses.clear()
                self._mapped.clear()
                self.generation += 1
                self.unknown_pods -= set(by_pod)
                self.unresolved_pods.clear()
            if by_slot != self._by_slot:  # a host process's slot may map one that missed
                self._misses.clear()
            self._by_limits, self._by_mount, self._by_pod, self._by_slot = by_limits, by_mount, by_pod, by_slot
            self._by_container = containers

    def owners(self, pids: Collection[int]) -> dict[int, Owner]:
        """The owners of pids NVML has just named (call it after the read): processes seen before
        are checked for exit in one poll of their pidfds, not a read of /proc each. A process
        alive now was alive at the read, so its pid named it; one that exited since is looked
        up afresh (its pid may be another process's by now)."""
        self._forget_exited()
        with self._lock:  # the known and mapped ones, at the cost of a lookup each
            mapped = self._mapped
            found = {pid: owner for pid in pids if (owner := mapped.get(pid)) is not None}
        if len(found) == len(pids):
            return found
        return found | {pid: owner for pid in pids if pid not in found and (owner := self._owner(pid)) is not None}

    def settle(self) -> int:
        """Forget the processes that have exited (one epoll_wait); the generation after it. While
        it stays the same, owners() of pids that were all mapped answers the same: only a change
        of _mapped (a process gone, a claim, pod or container changed, a new mapping) bumps it."""
        self._forget_exited()
        return self.generation

    def owner(self, pid: int) -> Owner | None:
        self._forget_exited(pid)
        return self._owner(pid)

    def kill(self, pid: int) -> bool:
        """SIGKILL the process known by pid through the pidfd held since its lookup: the one NVML
        named, never a process that took its pid since (gone already: nothing to do). False: not
        known here."""
        with self._lock:
            known = self._known.get(pid)
            if known is None:
                return False
            try:
                signal.pidfd_send_signal(known[0], signal.SIGKILL)
            except ProcessLookupError:
                pass
            return True

    def _forget_exited(self, pid: int | None = None) -> None:
        """Drop the pidfds (and so the start times) of processes that have exited: all known
        ones, or pid's."""
        with self._lock:
            if pid is not None:
                known = self._known.get(pid)
                ready = [known[0]] if known and _exited(known[0]) else []
            else:
                ready = [fd for fd, _ in self._poller.poll(0)]
            for fd in ready:
                self._drop(self._pid_of_fd[fd])

    def _drop(self, pid: int) -> None:
        fd, _ = self._known.pop(pid)
        if self._mapped.pop(pid, None) is not None:
            self.generation += 1
        del self._pid_of_fd[fd]
        self._poller.unregister(fd)
        os.close(fd)

    def _start_time(self, pid: int) -> int | None:
        """pid's start time: from the pidfd it is known by, else read (and a pidfd kept, opened
        before the read so that both name one process)."""
        with self._lock:
            known = self._known.get(pid)
            if known:
                return known[1]
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return None
        started = start_time(pid)
        if started is None or _exited(fd):
            os.close(fd)
            return None
        with self._lock:
            if pid in self._known:  # another thread got there first
                os.close(fd)
                return self._known[pid][1]
            self._known[pid] = (fd, started)
            self._pid_of_fd[fd] = pid
            self._poller.register(fd, select.EPOLLIN)  # readable once the process has exited
        return started

    def _owner(self, pid: int) -> Owner | None:
        started = self._start_time(pid)
        if started is None:
            return None
        key = (pid, started)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
            # A miss is looked at again at every call (the backstop's next poll), never left for
            # a while: one whose facts could not be read (its threads came and went) held its
            # memory unseen for that long (issue 40). What decides a miss, with the claims, pods
            # and slots unchanged (they clear the misses), is its cgroup and its mount table; a
            # tenant can only hide a claim's mount, not come to show one: so a process whose
            # /proc/<pid>/cgroup reads as it did before a miss read from a live thread still
            # maps nowhere (one small read, not the whole lookup).
            cgroup = _read(f"/proc/{pid}/cgroup")
            if cgroup is not None and self._misses.get(key) == cgroup:
                return None
            owner, sure = self._lookup(pid, key)
            if owner:
                self._cache[key] = owner
                if self._known.get(pid, (None, None))[1] == started:  # (still the process its pidfd holds)
                    self._mapped[pid] = owner
                    self.generation += 1
            elif sure and cgroup is not None:
                self._misses[key] = cgroup
            return owner

    def _lookup(self, pid: int, key: tuple[int, int]) -> tuple[Owner | None, bool]:
        """pid's owner, and whether its facts came from a thread live through their read."""
        live_at, (cgroup, table) = live(pid, lambda at: (_read(f"{at}/cgroup"), mounts(at)))  # one thread's facts
        sure = live_at is not None
        if cgroup and V1_AT_ROOT.search(cgroup) and not sure:
            return None, sure  # not its container's paths: mapped, it would be killed alone and its container live on
        own = cgroup is None or cgroup == self._cgroup  # the agent's own cgroup: never kill it whole
        found = layout(cgroup) if cgroup and not own else None
        pod = found[0] if found else None
        by_mount = {uid for dev, root, _ in table if (uid := self._by_mount.get((dev, root)))}
        if found:
            container = found[2]  # its container's cgroup, whatever the tenant made below it
            candidates = self._by_pod.get(found[0], [])
            if len(candidates) == 1:
                return Owner(candidates[0], pod, container), sure
            if not candidates:
                self.unknown_pods.add(found[0])
            else:  # several claims in one pod: the container tells which
                by_id = self._by_container.get(container_id(container) or "")
                if by_id in candidates:
                    return Owner(by_id, pod, container), sure
                self.unresolved_pods.add(found[0])
                by_mount &= set(candidates)  # until the pod is read, its mounts if they show
            cgroup = container
        if len(by_mount) == 1:
            return Owner(by_mount.pop(), pod, None if own else cgroup), sure
        at = live_at or f"/proc/{pid}"
        if _key(f"{at}/root") != self._root:
            return None, sure
        run_dir = _run_dir(at)
        limits = _key(os.path.join(run_dir, "limits")) if run_dir else None
        uid = (self._by_limits.get(limits) if limits else None) or self._by_slot.get(key)
        return Owner(uid, None, None) if uid else None, sure

    def forget_except(self, pids: set[int]) -> None:
        """Drop what is known of processes no longer on any GPU."""
        with self._lock:
            self._cache = {k: v for k, v in self._cache.items() if k[0] in pids}
            self._misses = {k: v for k, v in self._misses.items() if k[0] in pids}
            for pid in set(self._known) - pids:
                self._drop(pid)
