"""`gpushare-probe replay` (hook/tools/gpushare-probe.c): a trace of a framework-shaped step, its
bad lines refused with the file, line and what was wrong, and the traces shipped in hook/traces
replayed on the simulated driver (each kernel kind a function of its own)."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.support import BUILD, REPO
from tests.support.hook import kv, make_hook

TRACES = REPO / "hook" / "traces"


@pytest.fixture(scope="module")
def probe():
    make_hook()
    return BUILD / "gpushare-probe"


def replay(probe, tmp_path, trace, seconds="0.5"):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_") and k != "LD_PRELOAD"}
    env.update(GPUSHARE_SIM_STATE=str(tmp_path / "sim.state"), LD_LIBRARY_PATH=str(BUILD / "sim"))
    return subprocess.run([str(probe), "replay", "--trace", str(trace), "--seconds", seconds], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("text,error", [
    ("kernel 10\nlaunch 5\nsync\n",
     "t.trace:2: not an op (kernel, host, idle, sync, graph begin|end, repeat N|end): launch"),
    ("kernel 10 host=5\n", "t.trace:1: the trace has no sync: a step's end would be unknown"),
    ("kernel -3\nsync\n", "t.trace:1: want a number from 0.5 to 1e+06: -3"),
    ("kernel 10 stream=9\nsync\n", "t.trace:1: want a number from 0 to 7: 9"),
    ("kernel 10 colour=red\nsync\n", "t.trace:1: unknown kernel field (grid=, stream=, host=): colour=red"),
    ("graph begin\nkernel 10\nsync\ngraph end\n", "t.trace:3: a graph holds kernels only: sync"),
    ("repeat 2\nkernel 10\nsync\n", "t.trace:3: a repeat is not ended: repeat without end"),
])
def test_a_bad_line_is_refused_with_its_place(probe, tmp_path, text, error):
    trace = tmp_path / "t.trace"
    trace.write_text(text)
    p = replay(probe, tmp_path, trace)
    assert p.returncode == 64, (p.stdout, p.stderr)
    assert p.stderr.strip() == f"{trace.parent}/{error}", p.stderr


def test_graphs_repeats_and_streams_replay(probe, tmp_path):
    trace = tmp_path / "t.trace"
    trace.write_text("# a step\nrepeat 3\nkernel 100 host=5   # three\nend\n"
                     "graph begin\nkernel 50 x4\ngraph end\nkernel 20 stream=2 grid=16\nsync\nidle 100\n")
    p = replay(probe, tmp_path, trace)
    assert p.returncode == 0, p.stderr
    out = kv(p.stdout)
    # 3 x 100 + a graph of 4 x 50 + 20 us a step, three kinds of kernel (100, 50, 20/16 blocks)
    assert (out["step_gpu_ms"], out["graphs"], out["kernel_kinds"], out["ops"]) == ("0.520", "1", "3", "11"), out
    assert int(out["steps"]) > 100 and float(out["step_p50_ms"]) >= 0.52, out


@pytest.mark.parametrize("name", ["train-transformer", "train-transformer-h200", "elementwise", "serve-mlp"])
def test_the_shipped_traces_replay(probe, tmp_path, name):
    p = replay(probe, tmp_path, TRACES / f"{name}.trace", "1")
    assert p.returncode == 0, p.stderr
    out = kv(p.stdout)
    assert int(out["steps"]) > 0 and float(out["gpu_share"]) > 0, out
