"""The byte layouts Python shares with libgpushare.so: the usage region (hook/src/region.h) and
the control file (hook/src/control.h), little-endian (x86-64), documented in docs/interfaces.md.

The one Python copy of them: the kubelet plugin creates the files with these sizes, the node
agent reads and writes these fields, tests and benchmarks poke them. tests/hook/test_hooklayout.py
compiles the headers and fails when a size, constant or field here differs from C.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from kubeletplugin.strategies.mps import layout as mpslayout


class Field(NamedTuple):
    """One field of a C struct: byte offset and size (as offsetof/sizeof give them)."""

    offset: int
    size: int

    def read(self, buf: bytes) -> int:
        """The field's unsigned value in `buf` (a file's bytes, or a slice of its mapping)."""
        return int.from_bytes(buf[self.offset:self.offset + self.size], "little")

    def write(self, buf: bytearray, value: int) -> None:
        """Store `value` unsigned in `buf` (tests and tools that build or forge a file's bytes)."""
        buf[self.offset:self.offset + self.size] = value.to_bytes(self.size, "little")


# ---- usage region: one per (claim, GPU), tenant-writable --------------------------------------
REGION_SIZE = 1 << 20                     # GS_REGION_SIZE
REGION_MAGIC = 0x0031474552534750         # GS_REGION_MAGIC, "PGSREG1" little endian
REGION_VERSION = 1                        # GS_REGION_VERSION
HEADER_SIZE = 4096                        # GS_HEADER_SIZE: the slots start here
SLOT_SIZE = 64                            # GS_SLOT_SIZE
SLOT_COUNT = (REGION_SIZE - HEADER_SIZE) // SLOT_SIZE  # GS_SLOT_COUNT

# struct gs_region_header, every field in order
REGION_HEADER: dict[str, Field] = {
    "magic": Field(0, 8),
    "version": Field(8, 4),
    "header_size": Field(12, 4),
    "slot_size": Field(16, 4),
    "slot_count": Field(20, 4),
    "region_size": Field(24, 4),
    "holder": Field(28, 4),          # slot + 1 of the process inside the lock
    "lock": Field(32, 64),           # process-shared robust mutex
    "used": Field(96, 8),            # advisory: readers should sum the live slots
    "slots_hw": Field(104, 4),
    "lock_seq": Field(108, 4),
    "reaped": Field(112, 8),
    "pace_tat_ns": Field(120, 8),
    "pace_rate_ppm": Field(128, 4),  # the node agent may write it (one aligned 32-bit store)
    "pace_kernel_us": Field(132, 4),  # the longest booked launch; the agent zeroes it (32-bit store)
    "pace_gpu_ns": Field(136, 8),
    "paced_ns": Field(144, 8),
    "oom_refusals": Field(152, 8),
    "pace_turn": Field(160, 8),      # token << 40 | lapse (ns >> 10): whose turn it is in the claim's slot
    "pace_qend_ns": Field(168, 8),   # the predicted end of the claim's queued work (the fill relay reads it)
}

# struct gs_slot (slot i is at HEADER_SIZE + i * SLOT_SIZE), every field in order
SLOT: dict[str, Field] = {
    "in_use": Field(0, 4),
    "pid": Field(4, 4),              # signed
    "start_time": Field(8, 8),
    "pidns": Field(16, 8),
    "used": Field(24, 8),
    "pad": Field(32, 32),
}
SLOT_STRUCT = struct.Struct("<IiQQQ")  # in_use, pid, start_time, pidns, used: a slot's first 32 bytes

# ---- control file: one per (claim, GPU), written by the node agent only ------------------------
CONTROL_SIZE = 4096                       # GS_CONTROL_SIZE
CONTROL_MAGIC = 0x31304C5254435347        # GS_CONTROL_MAGIC, "GSCTRL01" little endian
CONTROL_VERSION = 1                       # GS_CONTROL_VERSION

# struct gs_control, every field in order
CONTROL: dict[str, Field] = {
    "magic": Field(0, 8),
    "version": Field(8, 4),
    "rate_ppm": Field(12, 4),        # one aligned 32-bit store
    "slot": Field(16, 8),            # start_us | length_us << 32, one aligned 64-bit store
    "period_us": Field(24, 4),
    "procs": Field(28, 4),           # the claim's processes on the GPU (agent's count); 0 = unknown
    "lent_us": Field(32, 4),         # a Burst claim's lent span right before its slot; 0 = none
    "unpaced": Field(36, 4),         # 1 = contexts nobody paces share the GPU: no slot handover
    "owner_busy_until_ns": Field(40, 8),  # a filling Burst claim: the Hard claims have work until then
    "relay_seen_ns": Field(48, 8),   # when the agent's fill relay last looked; 0 = no relay
}


def slot_offset(index: int) -> int:
    """Where slot `index` of a region starts."""
    return HEADER_SIZE + index * SLOT_SIZE


# ---- simulated MPS server (hook/sim/sim_mps.h): what the simulated driver reads -----------------
# A process is a client of a simulated MPS server when $CUDA_MPS_PIPE_DIRECTORY/SIM_MPS_FILE
# describes one (the trusted side writes it where the real control daemon would keep its pipes);
# the client's own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE may only lower the file's percentage.
SIM_MPS_PIPE_ENV = mpslayout.PIPE_ENV                                # GS_SIM_MPS_PIPE_ENV: MPS's own names
SIM_MPS_THREADS_ENV = mpslayout.THREAD_ENV                           # GS_SIM_MPS_THREADS_ENV
SIM_MPS_FILE = "gpushare-sim-mps"                                    # GS_SIM_MPS_FILE
SIM_MPS_VERSION = 1                                                  # GS_SIM_MPS_VERSION
SIM_MPS_KEY_VERSION = "GPUSHARE_SIM_MPS_VERSION"                     # GS_SIM_MPS_KEY_VERSION
SIM_MPS_KEY_SERVER = "GPUSHARE_SIM_MPS_SERVER"                       # GS_SIM_MPS_KEY_SERVER
SIM_MPS_KEY_THREADS = "GPUSHARE_SIM_MPS_ACTIVE_THREAD_PERCENTAGE"    # GS_SIM_MPS_KEY_THREADS
SIM_MPS_SERVER_MAX = 63                                              # GS_SIM_MPS_SERVER_MAX
# a kernel its client's share holds to fewer SMs than its grid asks for runs at this part of them
# (hook/sim/sim_sched.c MPS_HELD_PPM; the H100: a client at 30 % of the SMs alone ran 4096 matmuls
# at 24.6 % of solo, docs/compute.md "The simulated GPU")
SIM_MPS_HELD = 0.82
_SIM_MPS_SERVER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def sim_mps_server_text(server: str, active_thread_percentage: int) -> str:
    """The SIM_MPS_FILE text for clients of `server` (clients naming one server run concurrently)
    at `active_thread_percentage` (1..100). ValueError names the field and value the simulated
    driver would refuse."""
    if not 1 <= len(server) <= SIM_MPS_SERVER_MAX or not set(server) <= _SIM_MPS_SERVER_CHARS:
        raise ValueError(f"{SIM_MPS_KEY_SERVER}={server!r}: expected 1 to {SIM_MPS_SERVER_MAX} of [A-Za-z0-9._-]")
    if isinstance(active_thread_percentage, bool) or not 1 <= active_thread_percentage <= 100:
        raise ValueError(f"{SIM_MPS_KEY_THREADS}={active_thread_percentage!r}: expected 1..100")
    return (f"{SIM_MPS_KEY_VERSION}={SIM_MPS_VERSION}\n{SIM_MPS_KEY_SERVER}={server}\n"
            f"{SIM_MPS_KEY_THREADS}={active_thread_percentage}\n")
