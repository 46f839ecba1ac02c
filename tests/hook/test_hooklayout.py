"""kubeletplugin/hooklayout.py against hook/src/region.h, control.h and hook/sim/sim_mps.h: the field
lists are read from the headers' struct declarations, and offsets, sizes and constants from gcc
(offsetof, sizeof, the #defines' values), so C and Python cannot drift apart unnoticed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubeletplugin import hooklayout as L

SRC = Path(__file__).resolve().parents[2] / "hook" / "src"
SIM = SRC.parent / "sim"

# struct -> (header, Python's fields)
STRUCTS = {"gs_region_header": ("region.h", L.REGION_HEADER), "gs_slot": ("region.h", L.SLOT),
           "gs_control": ("control.h", L.CONTROL)}
DEFINES = {"GS_REGION_SIZE": L.REGION_SIZE, "GS_REGION_MAGIC": L.REGION_MAGIC, "GS_REGION_VERSION": L.REGION_VERSION,
           "GS_HEADER_SIZE": L.HEADER_SIZE, "GS_SLOT_SIZE": L.SLOT_SIZE, "GS_SLOT_COUNT": L.SLOT_COUNT,
           "GS_CONTROL_SIZE": L.CONTROL_SIZE, "GS_CONTROL_MAGIC": L.CONTROL_MAGIC,
           "GS_CONTROL_VERSION": L.CONTROL_VERSION, "GS_SIM_MPS_VERSION": L.SIM_MPS_VERSION,
           "GS_SIM_MPS_SERVER_MAX": L.SIM_MPS_SERVER_MAX}
STRINGS = {"GS_SIM_MPS_PIPE_ENV": L.SIM_MPS_PIPE_ENV, "GS_SIM_MPS_THREADS_ENV": L.SIM_MPS_THREADS_ENV,
           "GS_SIM_MPS_FILE": L.SIM_MPS_FILE, "GS_SIM_MPS_KEY_VERSION": L.SIM_MPS_KEY_VERSION,
           "GS_SIM_MPS_KEY_SERVER": L.SIM_MPS_KEY_SERVER, "GS_SIM_MPS_KEY_THREADS": L.SIM_MPS_KEY_THREADS}


def c_fields(text: str, struct: str) -> list[str]:
    """The member names of `struct <name> { ... };` in declaration order (a nested union or
    struct counts as one member, named by its declarator)."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)
    start = re.search(rf"struct\s+{struct}\s*{{", text)
    assert start, f"struct {struct} not found"
    depth, member, names = 0, "", []
    for ch in text[start.end():]:
        if ch == "}" and depth == 0:
            return names
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == ";" and depth == 0:
            names.append(re.findall(r"(\w+)\s*(?:\[[^\]]*\]\s*)*$", member.strip())[0])
            member = ""
        else:
            member += ch
    raise AssertionError(f"struct {struct}: no closing brace")


def mismatches(src: Path, tmp: Path, sim: Path = SIM) -> list[str]:
    """Every way hooklayout.py differs from the headers in `src` and `sim`; [] when they agree."""
    out, prints = [], []
    for struct, (header, fields) in STRUCTS.items():
        in_c = c_fields((src / header).read_text(), struct)
        if in_c != list(fields):
            out.append(f"struct {struct}: C has fields {in_c}, Python {list(fields)}")
        for name in fields:
            if name in in_c:
                prints.append(f'printf("{struct}.{name} %zu %zu\\n", offsetof(struct {struct}, {name}), '
                              f"sizeof(((struct {struct} *)0)->{name}));")
    prints += [f'printf("{d} %llu\\n", (unsigned long long)({d}));' for d in DEFINES]
    prints += [f'printf("{d} %s\\n", {d});' for d in STRINGS]
    program = tmp / "layout.c"
    program.write_text('#include <stdio.h>\n#include <stddef.h>\n#include "region.h"\n#include "control.h"\n'
                       '#include "sim_mps.h"\n'
                       "int main(void) {\n" + "\n".join(prints) + "\nreturn 0;\n}\n")
    built = subprocess.run(["gcc", "-std=gnu11", f"-I{src}", f"-I{sim}", "-o", str(tmp / "layout"), str(program)],
                           capture_output=True, text=True, timeout=60)
    if built.returncode != 0:
        return out + [f"gcc: {built.stderr.strip()}"]
    for line in subprocess.run([str(tmp / "layout")], capture_output=True, text=True, check=True,
                               timeout=30).stdout.splitlines():
        name, *values = line.split()
        if "." in name:
            struct, field = name.split(".")
            c, py = L.Field(*map(int, values)), STRUCTS[struct][1][field]
            if c != py:
                out.append(f"{name}: C has offset {c.offset} size {c.size}, Python offset {py.offset} size {py.size}")
        elif name in STRINGS:
            if values != [STRINGS[name]]:
                out.append(f"{name}: C has {' '.join(values)!r}, Python {STRINGS[name]!r}")
        elif int(values[0]) != DEFINES[name]:
            out.append(f"{name}: C has {int(values[0]):#x}, Python {DEFINES[name]:#x}")
    return out


def test_python_layouts_equal_the_headers(tmp_path):
    assert mismatches(SRC, tmp_path) == []


def test_slot_struct_unpacks_the_slot_fields_in_order():
    fields = [L.SLOT[n] for n in ("in_use", "pid", "start_time", "pidns", "used")]
    assert L.SLOT_STRUCT.format == "<IiQQQ"  # sizes 4 4 8 8 8
    assert [f.offset for f in fields] == [0, 4, 8, 16, 24] and L.SLOT_STRUCT.size == 32
    assert L.slot_offset(1) - L.slot_offset(0) == L.SLOT_SIZE == L.SLOT["pad"].offset + L.SLOT["pad"].size


def _swap_slots_hw_and_lock_seq(text: str) -> str:
    return (text.replace("uint32_t slots_hw;", "@").replace("uint32_t lock_seq;", "uint32_t slots_hw;")
            .replace("@", "uint32_t lock_seq;"))


# Each edit is one a header could plausibly get; none trips the headers' own _Static_asserts.
EDITS = {
    "fields swapped": ("region.h", _swap_slots_hw_and_lock_seq,
                       ["struct gs_region_header: C has fields", "gs_region_header.slots_hw: C has offset 108"]),
    "field narrowed": ("region.h", lambda t: t.replace("uint64_t reaped;", "uint32_t reaped;"),
                       ["gs_region_header.reaped: C has offset 112 size 4, Python offset 112 size 8"]),
    "field added": ("control.h", lambda t: t.replace("uint32_t period_us;", "uint32_t period_us;\n    uint32_t x;"),
                    ["struct gs_control: C has fields"]),
    "version bumped": ("control.h", lambda t: t.replace("GS_CONTROL_VERSION 1u", "GS_CONTROL_VERSION 2u"),
                       ["GS_CONTROL_VERSION: C has 0x2, Python 0x1"]),
    "MPS file renamed": ("sim_mps.h", lambda t: t.replace('"gpushare-sim-mps"', '"gpushare-mps"'),
                         ["GS_SIM_MPS_FILE: C has 'gpushare-mps', Python 'gpushare-sim-mps'"]),
}


@pytest.mark.parametrize("edit", EDITS)
def test_a_changed_header_is_caught(tmp_path, edit):
    header, change, expected = EDITS[edit]
    src, sim = tmp_path / "src", tmp_path / "sim"
    shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("*.c"))
    shutil.copytree(SIM, sim, ignore=shutil.ignore_patterns("*.c"))
    edited = (sim if header.startswith("sim_") else src) / header
    text = edited.read_text()
    assert change(text) != text
    edited.write_text(change(text))
    (tmp_path / "build").mkdir()
    found = mismatches(src, tmp_path / "build", sim)
    for e in expected:
        assert any(e in m for m in found), found


@pytest.mark.parametrize(("server", "pct", "message"), [
    ("gpu 0", 30, "GPUSHARE_SIM_MPS_SERVER='gpu 0'"), ("", 30, "GPUSHARE_SIM_MPS_SERVER=''"),
    ("x" * 64, 30, "expected 1 to 63"), ("gpu0", 0, "GPUSHARE_SIM_MPS_ACTIVE_THREAD_PERCENTAGE=0"),
    ("gpu0", 101, "ACTIVE_THREAD_PERCENTAGE=101"), ("gpu0", True, "ACTIVE_THREAD_PERCENTAGE=True")])
def test_sim_mps_server_text_refuses_what_the_simulator_would(server, pct, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        L.sim_mps_server_text(server, pct)


def test_sim_mps_server_text():
    assert L.sim_mps_server_text("gpu-0.a_b", 30).splitlines() == [
        "GPUSHARE_SIM_MPS_VERSION=1", "GPUSHARE_SIM_MPS_SERVER=gpu-0.a_b",
        "GPUSHARE_SIM_MPS_ACTIVE_THREAD_PERCENTAGE=30"]


def test_the_simulated_mps_held_factor_is_the_simulators():
    define = re.search(r"#define MPS_HELD_PPM (\d+)u", (SIM / "sim_sched.c").read_text())
    assert define and int(define.group(1)) == round(L.SIM_MPS_HELD * 1_000_000), define


def test_hooklayout_imports_with_the_standard_library_only():
    """hack/gpu-validate.sh and the probe tools import it with a GPU machine's system python,
    which has none of our dependencies: -S leaves every site-packages folder off the path."""
    repo = SRC.parents[1]
    code = f"import sys; sys.path.insert(0, {str(repo)!r}); import kubeletplugin.hooklayout"
    run = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_the_agents_switch_cost_is_the_librarys():
    """The agent reckons a slot's loss with the switch each slot's first launch books."""
    from kubeletplugin.agent.shares import SWITCH_US

    define = re.search(r"#define SWITCH_NS (\d+)ull", (SRC / "pacing.c").read_text())
    assert define and int(define.group(1)) == SWITCH_US * 1000, define
