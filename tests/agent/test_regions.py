"""The agent's reads of a usage region (kubeletplugin/agent/regions.py), a file its tenant can
truncate, grow, rewrite or (on an older release's layout, from the host) replace: never a wait,
never a crash, a region it cannot read is the claim's empty report."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kubeletplugin.agent.regions import EMPTY, Region
from kubeletplugin.hooklayout import (
    REGION_HEADER,
    REGION_MAGIC,
    REGION_SIZE,
    REGION_VERSION,
    SLOT,
    SLOT_SIZE,
    slot_offset,
)


def used_region(path) -> None:
    """A region as the library leaves it: initialised, `used` 7, one live slot of 7 bytes."""
    buf = bytearray(REGION_SIZE)
    for name, value in (("magic", REGION_MAGIC), ("version", REGION_VERSION), ("used", 7), ("slots_hw", 1),
                        ("pace_kernel_us", 500), ("pace_rate_ppm", 10)):
        REGION_HEADER[name].write(buf, value)
    slot = bytearray(SLOT_SIZE)
    for name, value in (("in_use", 1), ("pid", 42), ("used", 7)):
        SLOT[name].write(slot, value)
    buf[slot_offset(0):slot_offset(0) + SLOT_SIZE] = slot
    with open(path, "wb") as f:
        f.write(buf)


def test_a_region_cut_short_reads_as_empty_and_whole_again_reads_again(tmp_path):
    path = tmp_path / "region"
    used_region(path)
    region = Region(str(path))
    assert (region.used, [s.pid for s in region.slots()]) == (7, [42])
    os.truncate(path, 4096)  # the header without the slots: a mapping would have died of SIGBUS here
    assert (region.used, region.slots()) == (7, [])
    os.truncate(path, 0)
    assert (region.used, region.slots(), region.counters()) == (0, [], EMPTY)
    region.rate_ppm = 5
    assert os.path.getsize(path) == 0  # the agent wrote nothing into what it could not read
    used_region(path)
    assert (region.used, [s.pid for s in region.slots()]) == (7, [42])
    region.close()
    with pytest.raises(ValueError):  # the backstop's sign that the claim went away
        assert region.used


def test_a_grown_or_scribbled_region_is_read_within_its_layout(tmp_path):
    path = tmp_path / "region"
    used_region(path)
    with open(path, "r+b") as f:
        f.truncate(64 << 20)
    region = Region(str(path))
    assert (region.used, len(region.slots())) == (7, 1)
    with open(path, "r+b") as f:  # a forged slots_hw far past the slots
        f.seek(REGION_HEADER["slots_hw"].offset)
        f.write((2**32 - 1).to_bytes(4, "little"))
    assert len(region.slots()) == 1
    region.close()


def test_the_agents_own_writes_still_land(tmp_path):
    path = tmp_path / "region"
    used_region(path)
    region = Region(str(path))
    assert region.counters().kernel_us == 500
    region.clear_kernel_us()
    assert region.counters().kernel_us == 0
    region.rate_ppm = 250_000
    with open(path, "rb") as f:
        data = f.read()
    assert REGION_HEADER["pace_rate_ppm"].read(data) == 250_000 and REGION_HEADER["pace_kernel_us"].read(data) == 0
    region.close()


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_region_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    """Opened in a child with a deadline: a FIFO never makes the open wait for a writer, a link is
    never followed (its target is a readable region), a folder is no region."""
    path, target = tmp_path / "region", tmp_path / "target"
    used_region(target)
    {"fifo": lambda: os.mkfifo(path), "symlink": lambda: os.symlink(target, path),
     "directory": lambda: os.mkdir(path)}[kind]()
    code = ("import sys\nfrom kubeletplugin.agent.regions import Region\n"
            "try:\n    Region(sys.argv[1])\nexcept (OSError, ValueError) as e:\n    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=20)
    assert out.stdout.startswith("refused"), out
