"""A tenant writing its claim's region (hook/src/region.h) while it allocates: the claim stays
within its limit, every forgery is repaired and logged, and nothing hangs or locks it out."""
import mmap
import struct
import threading
import time

from kubeletplugin.hooklayout import HEADER_SIZE, REGION_HEADER, SLOT_SIZE, SLOT_STRUCT
from tests.support import MiB
from tests.support.hook import kv

LIMIT = 64 * MiB
USED = REGION_HEADER["used"].offset
LOCK_WORD = REGION_HEADER["lock"].offset  # the robust mutex's first word: the holder's thread id
SLOTS_HW = REGION_HEADER["slots_hw"].offset


def _region(c):
    c.run("gpushare-probe", "meminfo")  # the first user initialises the region
    f = open(c.region(0), "r+b")
    return f, mmap.mmap(f.fileno(), 0)


def _physical_used(c):
    """Bytes the simulated device really has allocated (the probe without the library)."""
    out = kv(c.run("gpushare-probe", "meminfo", preload=False).stdout)
    return int(out["cu_total"]) - int(out["cu_free"])


def test_used_zeroed_in_a_loop_stays_within_limit(make_claim):
    c = make_claim(memory=LIMIT)
    f, m = _region(c)
    holder = c.popen("gpushare-probe", "alloc", "--chunk", "16Mi", "--max", "48Mi", "--hold", "60")
    stop = threading.Event()

    def zero():
        while not stop.is_set():
            m[USED:USED + 8] = bytes(8)

    writer = threading.Thread(target=zero)
    try:
        assert "allocated=50331648" in "".join(holder.stdout.readline() for _ in range(4))
        writer.start()
        p = c.run("gpushare-probe", "alloc", "--chunk", "4Mi", "--hold", "0")
        physical = _physical_used(c)
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        holder.kill()
        holder.wait()
        m.close()
        f.close()
    assert int(kv(p.stdout)["allocated"]) == 16 * MiB, p.stdout
    assert physical <= LIMIT, physical
    assert "live slots hold" in p.stderr and "recomputed" in p.stderr, p.stderr


def test_used_max_recovers_and_logs(make_claim):
    c = make_claim(memory=LIMIT)
    f, m = _region(c)
    with f, m:
        m[USED:USED + 8] = struct.pack("<Q", 2**64 - 1)
        p = c.run("gpushare-probe", "alloc", "--chunk", "8Mi")
    assert int(kv(p.stdout)["allocated"]) == LIMIT, p.stdout
    assert f"used was {2**64 - 1}" in p.stderr, p.stderr


def test_forged_slot_cannot_lock_out_or_make_room(make_claim):
    """A dead slot forged to 2^64-1 is reclaimed; our own slot zeroed does not make room."""
    c = make_claim(memory=LIMIT)
    f, m = _region(c)
    with f, m:
        last = HEADER_SIZE + SLOT_SIZE * 100
        m[last:last + SLOT_STRUCT.size] = SLOT_STRUCT.pack(1, 12345, 0, 0, 2**64 - 1)
        m[SLOTS_HW:SLOTS_HW + 4] = struct.pack("<I", 101)
        p = c.run("gpushare-probe", "alloc", "--chunk", "8Mi")
    assert int(kv(p.stdout)["allocated"]) == LIMIT, p.stdout + p.stderr


def test_forged_lock_owner_is_repaired_quickly(make_claim):
    c = make_claim(memory=LIMIT)
    f, m = _region(c)
    with f, m:
        m[LOCK_WORD:LOCK_WORD + 4] = struct.pack("<I", 0x3FFFFFF0)  # a thread that does not exist
        t0 = time.monotonic()
        info = c.run("gpushare-probe", "meminfo", timeout=30)
        query_s = time.monotonic() - t0
        p = c.run("gpushare-probe", "alloc", "--chunk", "8Mi", timeout=30)
    assert int(kv(info.stdout)["cu_free"]) == LIMIT
    assert query_s < 3.0, query_s  # never waits for the lock (figure: hook/build/tests/t_region)
    assert int(kv(p.stdout)["allocated"]) == LIMIT, p.stdout
    assert "no live process inside" in p.stderr and "reinitialised" in p.stderr, p.stderr
