"""Which claim does a host process belong to?

Never from the process's environment or anything else a tenant can write: a process in a
container sees its claim's limits file at /var/run/gpushare/limits, a read-only bind mount of
<state-dir>/claims/<uid>/limits, and a bind mount has the same (st_dev, st_ino). So
`stat /proc/<pid>/root/var/run/gpushare/limits` names the claim.

Processes on the host itself (the library's GPUSHARE_RUN_DIR mode: tests, ProcessRunner, hack
scripts) have no such mount. For them only, that is for processes whose root is the agent's
root, the agent follows $GPUSHARE_RUN_DIR/limits (a link to the claim's limits file; still
matched by inode, so it can only name a claim file the process can reach), and else the pids
recorded in the claims' region slots by processes in the agent's own pid namespace (checked
against the process's start time, so a reused pid does not match).
"""

from __future__ import annotations

import os

CONTAINER_LIMITS = "var/run/gpushare/limits"


def _key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), as the library records it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[19])


def _run_dir(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"GPUSHARE_RUN_DIR="):
            return os.fsdecode(item.split(b"=", 1)[1])
    return None


class ProcessMap:
    def __init__(self) -> None:
        self._root = _key("/")
        self._pidns = _key("/proc/self/ns/pid")
        self._by_limits: dict[tuple[int, int], str] = {}
        self._by_slot: dict[tuple[int, int], str] = {}  # (pid, start_time) in our namespace -> uid
        self._cache: dict[tuple[int, int], str] = {}  # (pid, start_time) -> uid

    def update(self, limits_files: dict[str, str], slots: dict[str, list]) -> None:
        """limits_files: uid -> host limits path; slots: uid -> the region slots of the claim."""
        by_limits = {k: uid for uid, path in limits_files.items() if (k := _key(path))}
        if by_limits != self._by_limits:
            self._cache.clear()  # a claim came or went
        self._by_limits = by_limits
        ns = self._pidns[1] if self._pidns else None
        self._by_slot = {(s.pid, s.start_time): uid for uid, ss in slots.items() for s in ss if s.pidns == ns}

    def claim_of(self, pid: int) -> str | None:
        started = start_time(pid)
        if started is None:
            return None
        key = (pid, started)
        uid = self._cache.get(key)
        if uid is None:  # misses are looked up again: a host process registers its slot late
            uid = self._lookup(pid, key)
            if uid:
                self._cache[key] = uid
        return uid

    def _lookup(self, pid: int, key: tuple[int, int]) -> str | None:
        uid = self._by_limits.get(_key(f"/proc/{pid}/root/{CONTAINER_LIMITS}"))
        if uid or _key(f"/proc/{pid}/root") != self._root:
            return uid
        run_dir = _run_dir(pid)
        if run_dir and (uid := self._by_limits.get(_key(os.path.join(run_dir, "limits")))):
            return uid
        return self._by_slot.get(key)

    def forget_except(self, pids: set[int]) -> None:
        """Drop cache entries of processes no longer on any GPU."""
        self._cache = {k: v for k, v in self._cache.items() if k[0] in pids}
