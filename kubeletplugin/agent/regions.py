"""The usage regions (layout: kubeletplugin/hooklayout.py, from hook/src/region.h), seen by the node agent.

The agent only reads the region, except for two 32-bit fields the layout reserves for it (aligned
stores: the library uses each with one atomic operation): `pace_rate_ppm`, written only for claims
without a control file (control.py; prepared by an older plugin), and `pace_kernel_us`, zeroed
after each read. Everything read here is
tenant-writable, so it is treated as a claim's own report about itself, never as a limit.

A tenant can also truncate, grow or rewrite the file itself at any moment (its container mounts
it read-write), so the agent never maps it: a mapping of a file that shrank kills its reader with
SIGBUS, and the agent is the plugin's process. It reads and writes with pread/pwrite, and a region
cut shorter than its layout reads as empty (logged once).
"""

from __future__ import annotations

import os
import stat
import struct
import threading
from dataclasses import dataclass

from dra_driver.log import get_logger
from kubeletplugin.hooklayout import (
    REGION_HEADER,
    REGION_MAGIC,
    REGION_VERSION,
    SLOT_COUNT,
    SLOT_SIZE,
    SLOT_STRUCT,
    Field,
    slot_offset,
)

log = get_logger("agent.regions")

_MAGIC, _VERSION, _USED, _SLOTS_HW = (REGION_HEADER[f] for f in ("magic", "version", "used", "slots_hw"))
_PACE_RATE_PPM, _PACE_KERNEL_US, _PACE_GPU_NS, _PACED_NS, _OOM_REFUSALS, _PACE_QEND_NS = (
    REGION_HEADER[f]
    for f in ("pace_rate_ppm", "pace_kernel_us", "pace_gpu_ns", "paced_ns", "oom_refusals", "pace_qend_ns"))
_HEADER_READ = max(f.offset + f.size for f in REGION_HEADER.values())  # the header's fields, in one pread


@dataclass(frozen=True)
class Header:
    """The header's counters as one pread found them (a period reads each region once)."""

    used: int
    charged_ns: int    # pace_gpu_ns: GPU time the library charged the claim's launches
    queue_end_ns: int  # pace_qend_ns: when its queued work ends (CLOCK_MONOTONIC; 0 = not said)
    paced_ns: int
    kernel_us: int     # pace_kernel_us: the longest launch booked since the agent last zeroed it


EMPTY = Header(0, 0, 0, 0, 0)


@dataclass(frozen=True)
class Slot:
    pid: int          # in the owner's pid namespace
    start_time: int   # /proc/<pid>/stat field 22 of the owner
    pidns: int        # inode of the owner's pid namespace
    used: int


class Region:
    """One region file, open for pread/pwrite. A region nobody has used yet is all zeros and reads
    as empty. ValueError when `path` is not a regular file (a FIFO, a folder; a symlink is
    refused by the open), and from every read once closed."""

    def __init__(self, path: str):
        self.path = path
        # O_NONBLOCK: opening a FIFO never waits for a writer; O_NOFOLLOW: never a link's target
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError(f"{path}: not a regular file")
        self._fd = fd
        self._fd_lock = threading.Lock()  # the backstop reads while the period may close: no read of a reused fd
        self._told_short = False

    def close(self) -> None:
        with self._fd_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _read(self, offset: int, size: int) -> bytes | None:
        """`size` bytes at `offset`; None when the file is shorter (a tenant cut it) or unreadable."""
        with self._fd_lock:
            if self._fd < 0:
                raise ValueError(f"{self.path}: closed")
            try:
                data = os.pread(self._fd, size, offset)
            except OSError as e:
                data, error = b"", str(e)
            else:
                error = f"{offset + len(data)} bytes where the layout reads {offset + size}"
        if len(data) == size:
            return data
        if not self._told_short:
            self._told_short = True
            log.warning("usage region cut short or unreadable (its tenant can write it): read as empty",
                        path=self.path, error=error)
        return None

    def _store32(self, offset: int, value: int) -> None:
        # one 4-byte pwrite at an aligned offset (the library uses the field atomically)
        with self._fd_lock:
            if self._fd >= 0:
                os.pwrite(self._fd, struct.pack("<I", value), offset)

    def _header(self) -> bytes | None:
        """The header's bytes when the region is initialised (whole and of this layout), else None."""
        h = self._read(0, _HEADER_READ)
        return h if h is not None and _MAGIC.read(h) == REGION_MAGIC and _VERSION.read(h) == REGION_VERSION else None

    def counters(self) -> Header:
        """The header's counters in one read (EMPTY when the region is not initialised)."""
        h = self._header()
        if h is None:
            return EMPTY
        return Header(_USED.read(h), _PACE_GPU_NS.read(h), _PACE_QEND_NS.read(h), _PACED_NS.read(h),
                      _PACE_KERNEL_US.read(h))

    @property
    def initialised(self) -> bool:
        return self._header() is not None

    def _field(self, field: Field) -> int:
        h = self._header()
        return field.read(h) if h is not None else 0

    @property
    def used(self) -> int:
        return self._field(_USED)

    @property
    def oom_refusals(self) -> int:
        return self._field(_OOM_REFUSALS)

    def clear_kernel_us(self) -> None:
        """Zero `pace_kernel_us` after counters() found it set. A launch between the read and the
        store is lost: the next one reports it again."""
        self._store32(_PACE_KERNEL_US.offset, 0)

    @property
    def rate_ppm(self) -> int:
        """`pace_rate_ppm` (named like Control.rate_ppm: the agent writes one or the other)."""
        return self._field(_PACE_RATE_PPM)

    @rate_ppm.setter
    def rate_ppm(self, ppm: int) -> None:
        # Only into an initialised region: the first user's initialisation zeroes the header.
        ppm = max(0, min(ppm, 1_000_000))
        h = self._header()
        if h is not None and _PACE_RATE_PPM.read(h) != ppm:
            self._store32(_PACE_RATE_PPM.offset, ppm)

    def slots(self) -> list[Slot]:
        """Slots in use (their owners may have died and not been reaped yet)."""
        h = self._header()
        hw = min(_SLOTS_HW.read(h), SLOT_COUNT) if h is not None else 0
        data = (self._read(slot_offset(0), hw * SLOT_SIZE) if hw else None) or b""
        out = []
        for i in range(len(data) // SLOT_SIZE):
            in_use, pid, start, pidns, used = SLOT_STRUCT.unpack_from(data, i * SLOT_SIZE)
            if in_use:
                out.append(Slot(pid, start, pidns, used))
        return out
