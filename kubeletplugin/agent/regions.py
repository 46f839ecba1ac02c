"""The usage regions (layout: kubeletplugin/hooklayout.py, from hook/src/region.h), seen by the node agent.

The agent only reads the region, except for two 32-bit fields the layout reserves for it (aligned
stores: the library uses each with one atomic operation): `pace_rate_ppm`, written only for claims
without a control file (control.py; prepared by an older plugin), and `pace_kernel_us`, zeroed
after each read. Everything read here is
tenant-writable, so it is treated as a claim's own report about itself, never as a limit.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from dataclasses import dataclass

from kubeletplugin.hooklayout import (
    REGION_HEADER,
    REGION_MAGIC,
    REGION_SIZE,
    REGION_VERSION,
    SLOT_COUNT,
    SLOT_STRUCT,
    slot_offset,
)

_MAGIC, _VERSION, _USED, _SLOTS_HW = (REGION_HEADER[f].offset for f in ("magic", "version", "used", "slots_hw"))
_PACE_RATE_PPM, _PACE_KERNEL_US, _PACE_GPU_NS, _PACED_NS, _OOM_REFUSALS, _PACE_QEND_NS = (
    REGION_HEADER[f].offset
    for f in ("pace_rate_ppm", "pace_kernel_us", "pace_gpu_ns", "paced_ns", "oom_refusals", "pace_qend_ns"))


@dataclass(frozen=True)
class Slot:
    pid: int          # in the owner's pid namespace
    start_time: int   # /proc/<pid>/stat field 22 of the owner
    pidns: int        # inode of the owner's pid namespace
    used: int


class Region:
    """One mapped region file. A region nobody has used yet is all zeros and reads as empty."""

    def __init__(self, path: str):
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            if os.fstat(fd).st_size != REGION_SIZE:
                raise ValueError(f"{path}: size {os.fstat(fd).st_size}, expected {REGION_SIZE}")
            self._map = mmap.mmap(fd, REGION_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)  # the mapping keeps the file
        # one aligned 32-bit store for pace_rate_ppm (struct.pack_into writes byte by byte)
        self._words = memoryview(self._map).cast("I")  # x86-64: native = little endian

    def close(self) -> None:
        self._words.release()
        self._map.close()

    @property
    def address(self) -> int:
        """Where this process maps the region (its line in /proc/self/maps: procmap.own_mapping)."""
        byte = ctypes.c_char.from_buffer(self._map)  # (an export of the map: dropped at once, close still works)
        try:
            return ctypes.addressof(byte)
        finally:
            del byte

    def _u64(self, offset: int) -> int:
        value: int = struct.unpack_from("<Q", self._map, offset)[0]
        return value

    @property
    def initialised(self) -> bool:
        return self._u64(_MAGIC) == REGION_MAGIC and struct.unpack_from("<I", self._map, _VERSION)[0] == REGION_VERSION

    @property
    def used(self) -> int:
        return self._u64(_USED) if self.initialised else 0

    @property
    def charged_ns(self) -> int:
        """GPU time the library charged the claim's launches (`pace_gpu_ns`)."""
        return self._u64(_PACE_GPU_NS) if self.initialised else 0

    @property
    def queue_end_ns(self) -> int:
        """When the claim's queued work ends, as its last launching process predicts
        (`pace_qend_ns`, CLOCK_MONOTONIC; 0 = not said)."""
        return self._u64(_PACE_QEND_NS) if self.initialised else 0

    @property
    def paced_ns(self) -> int:
        return self._u64(_PACED_NS) if self.initialised else 0

    @property
    def oom_refusals(self) -> int:
        return self._u64(_OOM_REFUSALS) if self.initialised else 0

    def take_kernel_us(self) -> int:
        """The longest launch the library booked since the last call, us (0: none), and zero it. A
        launch between the read and the store is lost: the next one reports it again."""
        if not self.initialised:
            return 0
        us: int = self._words[_PACE_KERNEL_US // 4]
        if us:
            self._words[_PACE_KERNEL_US // 4] = 0
        return us

    @property
    def rate_ppm(self) -> int:
        """`pace_rate_ppm` (named like Control.rate_ppm: the agent writes one or the other)."""
        return self._words[_PACE_RATE_PPM // 4]

    @rate_ppm.setter
    def rate_ppm(self, ppm: int) -> None:
        # Only into an initialised region: the first user's initialisation zeroes the header.
        ppm = max(0, min(ppm, 1_000_000))
        if self.initialised and self.rate_ppm != ppm:
            self._words[_PACE_RATE_PPM // 4] = ppm

    def slots(self) -> list[Slot]:
        """Slots in use (their owners may have died and not been reaped yet)."""
        if not self.initialised:
            return []
        hw = min(struct.unpack_from("<I", self._map, _SLOTS_HW)[0], SLOT_COUNT)
        out = []
        for i in range(hw):
            in_use, pid, start, pidns, used = SLOT_STRUCT.unpack_from(self._map, slot_offset(i))
            if in_use:
                out.append(Slot(pid, start, pidns, used))
        return out
