"""The backstop's NVML query (sampler.RunningProcesses): nvmlDeviceGetComputeRunningProcesses_v3
called through ctypes into a reused buffer must answer what pynvml's own wrapper answers, on the
simulated NVML the agent loads and against a stand-in driver for the answers the simulator never
gives (more processes than the buffer, processes starting between two calls, several entries of
one pid, memory not available, errors)."""

from __future__ import annotations

import ctypes
import struct
import threading

import pynvml
import pytest

from kubeletplugin.agent import sampler
from kubeletplugin.agent.sampler import RunningProcesses, Sampler
from tests.support import MiB, wait_for

NOT_AVAILABLE = (1 << 64) - 1
ENTRY = struct.Struct("=I4xQII")  # nvmlProcessInfo_t: pid, usedGpuMemory, gpuInstanceId, computeInstanceId


def by_pid(procs) -> dict[int, int]:
    """pynvml's answer as the sampler reported it before: bytes summed per pid, None as 0."""
    out: dict[int, int] = {}
    for p in procs:
        out[p.pid] = out.get(p.pid, 0) + (p.usedGpuMemory or 0)
    return out


def in_thread(fn):
    """fn() on a fresh thread: a fresh per-thread buffer, as the backstop's and the agent's."""
    box = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start()
    t.join()
    return box[0]


def test_the_same_answer_as_pynvml_on_the_simulated_nvml(node, monkeypatch):
    ref, ids = node.claim(memory="1Gi")
    sizes = [16, 32, 48]
    workers = [node.run(f"p{n}", ids, "alloc", "--chunk", f"{m}Mi", "--max", f"{m}Mi", "--hold", "30")
               for n, m in enumerate(sizes)]
    for w in workers:
        w.read_until("allocated=")
    s = node.plugin.agent._sampler
    h = s._handles[0]
    pids = {w.proc.pid for w in workers}
    got = wait_for(lambda: (m := s._running(h)) and pids <= set(m) and m)
    assert {pid: got[pid] for pid in pids} == {w.proc.pid: m * MiB for w, m in zip(workers, sizes, strict=True)}
    assert got == by_pid(pynvml.nvmlDeviceGetComputeRunningProcesses(h))
    every = s.process_memory()  # (the node has several GPUs: the others hold nothing)
    assert set(every) == set(s._uuids) and every[s._uuids[0]] == got
    assert s.process_memory({s._uuids[0]}) == {s._uuids[0]: got}
    assert s.process_memory({"GPU-none"}) == {}  # only the GPUs asked for: no claim, no query
    # a buffer smaller than the answer grows (INSUFFICIENT_SIZE, then the entries), same answer
    monkeypatch.setattr(sampler, "_FIRST_CAPACITY", 1)
    small = RunningProcesses()
    answer, room = in_thread(lambda: (small(h), len(small._local.buf) // ctypes.sizeof(pynvml.c_nvmlProcessInfo_t)))
    assert answer == got and room >= len(got) > 1
    assert in_thread(lambda: getattr(small._local, "buf", None)) is None  # one buffer per thread


class Driver:
    """A stand-in for the C function: entries per handle; grow(n) more entries appear after each
    call that answered INSUFFICIENT_SIZE for n (processes starting between the two calls)."""

    def __init__(self, entries: dict[int, list[tuple[int, int]]], grow=lambda n: 0,
                 error: dict[int, int] | None = None):
        self.entries, self.grow, self.error, self.calls = entries, grow, error or {}, 0
        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p)
        self.fn = proto(self._call)

    def _call(self, handle, count, infos):
        self.calls += 1
        if handle in self.error:
            return self.error[handle]
        entries = self.entries[handle]
        if count[0] < len(entries):
            count[0] = len(entries)
            entries += [(90000 + len(entries) + i, MiB) for i in range(self.grow(len(entries)))]
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        data = b"".join(ENTRY.pack(pid, used, 0xFFFFFFFF, 0xFFFFFFFF) for pid, used in entries)
        ctypes.memmove(infos, data, len(data))
        count[0] = len(entries)
        return pynvml.NVML_SUCCESS


def test_the_buffer_grows_and_is_kept():
    d = Driver({1: [(100 + i, i * MiB) for i in range(200)]}, grow=lambda n: 300)
    running = RunningProcesses(d.fn)
    first = running(1)
    assert first == {100 + i: i * MiB for i in range(200)} | {90000 + n: MiB for n in range(200, 800)}
    assert d.calls == 3  # room for 64 < 200 (then 500), for 405 < 500 (then 800), for 1005: the answer
    d.calls = 0
    assert running(1) == first and d.calls == 1  # the grown buffer is kept: one call per poll


def test_entries_of_one_pid_are_summed_and_unavailable_memory_counts_zero():
    d = Driver({1: [(10, MiB), (11, NOT_AVAILABLE), (10, 2 * MiB), (12, 5 * MiB)]})
    assert RunningProcesses(d.fn)(1) == {10: 3 * MiB, 11: 0, 12: 5 * MiB}
    d = Driver({1: [(11, NOT_AVAILABLE), (12, 5 * MiB)]})
    assert RunningProcesses(d.fn)(1) == {11: 0, 12: 5 * MiB}
    assert RunningProcesses(Driver({1: []}).fn)(1) == {}


def test_errors_are_nvml_errors_and_a_failed_gpu_is_left_out():
    d = Driver({1: [(10, MiB), (10, 2 * MiB)], 2: []}, error={2: pynvml.NVML_ERROR_UNKNOWN})
    with pytest.raises(pynvml.NVMLError) as e:
        RunningProcesses(d.fn)(2)
    assert e.value.value == pynvml.NVML_ERROR_UNKNOWN
    s = Sampler.__new__(Sampler)
    s._uuids, s._handles, s._running = ["GPU-a", "GPU-b"], [1, 2], RunningProcesses(d.fn)
    s._devices, s._missing = dict(zip(s._uuids, s._handles, strict=True)), set()  # (no GPU in MIG mode)
    assert s.process_memory() == {"GPU-a": {10: 3 * MiB}}  # unread is not empty: GPU-b absent


def test_a_driver_that_never_has_room_leaves_the_gpu_unread():
    d = Driver({1: [(10 + i, MiB) for i in range(100)]}, grow=lambda n: 2 * n)  # more than the buffer grows by
    with pytest.raises(pynvml.NVMLError) as e:
        RunningProcesses(d.fn)(1)
    assert e.value.value == pynvml.NVML_ERROR_INSUFFICIENT_SIZE and d.calls == sampler._TRIES
