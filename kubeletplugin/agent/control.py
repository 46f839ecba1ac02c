"""The trusted control file of a (claim, GPU) (layout: kubeletplugin/hooklayout.py, from hook/src/control.h).

Created zero-filled by the kubelet plugin (root, 0644) and mounted read-only into containers,
so unlike the usage region no tenant can write it: the library trusts its rate, even above the
claim's limit. Only the agent writes it: magic and version once, then the rate with one aligned
32-bit store and the time slot with one 64-bit store, through native-int views (struct.pack_into
writes byte by byte: a reader could see half of it); the library reads it with one atomic load.
"""

from __future__ import annotations

import mmap
import os
import struct

from kubeletplugin.hooklayout import CONTROL, CONTROL_MAGIC, CONTROL_SIZE, CONTROL_VERSION

from .shares import Share, to_ppm

_MAGIC, _VERSION, _RATE_PPM, _SLOT, _PERIOD_US, _PROCS, _LENT_US, _UNPACED, _OWNER_BUSY, _RELAY_SEEN = (
    CONTROL[f].offset for f in ("magic", "version", "rate_ppm", "slot", "period_us", "procs", "lent_us", "unpaced",
                                "owner_busy_until_ns", "relay_seen_ns"))


class Control:
    def __init__(self, path: str):
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            if size != CONTROL_SIZE:
                raise ValueError(f"{path}: size {size}, expected {CONTROL_SIZE}")
            self._map = mmap.mmap(fd, CONTROL_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)  # the mapping keeps the file
        self._words = memoryview(self._map).cast("I")  # x86-64: native = little endian
        self._quads = memoryview(self._map).cast("Q")
        if struct.unpack_from("<Q", self._map, _MAGIC)[0] != CONTROL_MAGIC:
            # header before any rate: the library reads a rate only under a valid header
            struct.pack_into("<I", self._map, _VERSION, CONTROL_VERSION)
            struct.pack_into("<Q", self._map, _MAGIC, CONTROL_MAGIC)

    def close(self) -> None:
        self._quads.release()
        self._words.release()
        self._map.close()

    @property
    def rate_ppm(self) -> int:
        return self._words[_RATE_PPM // 4]

    @rate_ppm.setter
    def rate_ppm(self, ppm: int) -> None:
        self._store(_RATE_PPM, ppm, 1_000_000)

    def _store(self, offset: int, value: int, ceiling: int = 0xFFFFFFFF) -> None:
        """One 32-bit field, clamped to 0..ceiling; written only when it changes."""
        value = max(0, min(value, ceiling))
        if self._words[offset // 4] != value:
            self._words[offset // 4] = value

    def plan(self, share: Share) -> None:
        """The agent's plan for the claim on this GPU (shares.py): its rate, slot, lent span,
        whether contexts nobody paces share the GPU, and the claim's processes on it (`procs`)."""
        self.rate_ppm = to_ppm(share.rate)
        self.set_slot(share.period_us, share.start_us, share.length_us)
        self.lent_us = share.lent_us
        self.unpaced = share.unpaced
        self.procs = share.procs

    def unplan(self) -> None:
        """Nobody hands slots out any more: back to the limit, no slot, no lent span."""
        self.rate_ppm = 0
        self.set_slot(0, 0, 0)
        self.lent_us = 0
        self.unpaced = False
        self.relay(0, 0)

    @property
    def slot(self) -> tuple[int, int, int]:
        """(period_us, start_us, length_us); length 0 = no slot."""
        slot = self._quads[_SLOT // 8]
        return self._words[_PERIOD_US // 4], slot & 0xFFFFFFFF, slot >> 32

    def set_slot(self, period_us: int, start_us: int, length_us: int) -> None:
        """The claim's time slot (docs/compute.md): the period first, then start and length in
        one aligned 64-bit store, so the library never sees half of a slot."""
        if self.slot != (period_us, start_us, length_us):
            self._words[_PERIOD_US // 4] = period_us
            self._quads[_SLOT // 8] = start_us | length_us << 32

    @property
    def procs(self) -> int:
        """The claim's processes on the GPU as the agent sees them (NVML, mapped from kernel facts);
        0 = unknown. A library that finds the claim's shared timeline in the region forged paces
        itself at the claim's rate / procs (hook/src/pacing.c, book_shared)."""
        return self._words[_PROCS // 4]

    @procs.setter
    def procs(self, n: int) -> None:
        self._store(_PROCS, n)

    @property
    def lent_us(self) -> int:
        """A busy Burst claim's lent span, right before its slot: the idle tail of the busy Hard claim's
        slot before it, where its library launches while the GPU runs no other work
        (docs/compute.md); 0 = none."""
        return self._words[_LENT_US // 4]

    @lent_us.setter
    def lent_us(self, us: int) -> None:
        self._store(_LENT_US, us)

    @property
    def unpaced(self) -> bool:
        """Contexts nobody paces share the GPU (a claim of strategy None, an MPS server): the
        library then paces without the slot handover, which only keeps paced claims apart
        (docs/compute.md)."""
        return self._words[_UNPACED // 4] == 1

    @unpaced.setter
    def unpaced(self, on: bool) -> None:
        self._store(_UNPACED, int(on))

    def relay(self, owner_busy_until_ns: int, seen_ns: int) -> None:
        """A filling Burst claim's word from the relay (relay.py): the GPU's Hard claims have work
        until about owner_busy_until_ns; seen_ns, when the relay looked (0: no relay). One aligned
        64-bit store each."""
        if self._quads[_OWNER_BUSY // 8] != owner_busy_until_ns:
            self._quads[_OWNER_BUSY // 8] = owner_busy_until_ns
        self._quads[_RELAY_SEEN // 8] = seen_ns
