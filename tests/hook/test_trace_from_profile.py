"""hack/trace-from-profile.py: a torch.profiler chrome trace (hand-made here, shaped as
export_chrome_trace writes it) becomes a gpushare-probe replay trace, and the probe replays it on
the simulated driver."""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from tests.support import REPO
from tests.support.hook import kv

SCRIPT = REPO / "hack" / "trace-from-profile.py"
_spec = importlib.util.spec_from_file_location("trace_from_profile", SCRIPT)
assert _spec and _spec.loader
tfp = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = tfp  # its dataclasses look their module up
_spec.loader.exec_module(tfp)

PID, MAIN, AUTOGRAD = 4242, 4242, 4250


def call(name, ts, dur, corr, tid=MAIN):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": corr + 1000, "cbid": 211, "correlation": corr}}


def kernel(ts, dur, corr, grid=(132, 1, 1), stream=7, name="void at::native::vectorized_elementwise_kernel<4>(int)"):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"External id": corr + 1000, "queued": 0, "device": 0, "context": 1, "stream": stream,
                     "correlation": corr, "registers per thread": 16, "shared memory": 0, "grid": list(grid),
                     "block": [128, 1, 1], "est. achieved occupancy %": 100}}


def cpu_op(name, ts, dur, tid=MAIN):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": 1, "Record function id": 0}}


def profile() -> dict:
    """two ProfilerSteps; the second: a batch copied in, three equal elementwise kernels, a small
    and a second-stream kernel, a launch from the autograd thread, a graph launch, a sync, host
    work under an op, a device sync, then the thread asleep until the step ends"""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": PID, "tid": MAIN, "ts": 1000,
         "dur": 900},
        call("cudaLaunchKernel", 1100, 4, 1), kernel(1110, 999, 1),
        call("cudaDeviceSynchronize", 1200, 900, 2),
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": PID, "tid": MAIN, "ts": 10000,
         "dur": 9850},
        cpu_op("aten::randint", 10000, 900),
        call("cudaMemcpyAsync", 10950, 5, 10),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7, "ts": 10960,
         "dur": 20.3, "args": {"device": 0, "context": 1, "stream": 7, "correlation": 10, "bytes": 32768}},
        call("cudaLaunchKernel", 10961, 4, 11), kernel(10990, 6.04, 11, (4096, 1, 1)),
        call("cudaLaunchKernel", 10971, 4, 12), kernel(11000, 6.01, 12, (4096, 1, 1)),
        call("cudaLaunchKernel", 10981, 4, 13), kernel(11010, 5.97, 13, (4096, 1, 1)),
        call("cudaLaunchKernel", 10991, 4, 14), kernel(11020, 85.3, 14, (16, 1, 1), name="void gemv<half>(x)"),
        call("cudaLaunchKernel", 11001, 4, 15), kernel(11030, 110, 15, (264, 1, 1), stream=13),
        call("cudaGetDevice", 11020, 1, 16),
        call("cudaLaunchKernel", 11091, 4, 17, tid=AUTOGRAD), kernel(11150, 220, 17, (132, 1, 1)),
        call("cudaGraphLaunch", 11191, 10, 18), kernel(11400, 30, 18, ()), kernel(11430, 40, 18, ()),
        call("cudaStreamSynchronize", 11291, 500, 19),
        cpu_op("aten::zeros", 11800, 900),
        call("cudaLaunchKernel", 12791, 4, 20), kernel(12810, 12, 20, (1, 1, 1)),
        call("cudaDeviceSynchronize", 12811, 33, 21),
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7, "ts": 12810, "id": 20, "bp": "e"},
    ]
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
            "traceEvents": ev, "traceName": "hand-made.pt.trace.json", "displayTimeUnit": "ms"}


EXPECTED = [
    "kernel 20 host=950",          # the batch copied in after 950 us of host work (an op covers it)
    "kernel 6 host=6 x3",          # three equal launches, rounded alike
    "kernel 85 grid=16 host=6",    # a small grid is kept
    "kernel 110 stream=1 host=6",  # 264 blocks fill the GPU: no grid=; CUDA stream 13 -> 1
    "kernel 220 host=86",          # from the autograd thread, in time order; cudaGetDevice is host time
    "host 96",                     # before the graph launch
    "graph begin", "kernel 30", "kernel 40", "graph end",
    "host 90",                     # then the sync: its wait is not host time
    "sync",
    "kernel 12 grid=1 host=1000",  # 1 ms under aten::zeros: host, not idle
    "host 16",
    "sync",
    "idle 7000",                   # the rest of the step with no op running: asleep
]


def ops_of(text: str) -> list[str]:
    return [re.sub(r"\s+", " ", line.split("#")[0]).strip() for line in text.splitlines()
            if line.split("#")[0].strip()]


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "profile.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(profile(), f)
    return path


def test_help():
    run = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "ProfilerStep" in run.stdout and "--idle-over" in run.stdout, run.stderr


def test_a_profiled_step_becomes_a_trace_the_simulator_replays(build, tmp_path, profile_file):
    out = tmp_path / "hand-made.trace"
    run = subprocess.run([sys.executable, str(SCRIPT), str(profile_file), "-o", str(out), "--title", "test"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    text = out.read_text()
    assert ops_of(text) == EXPECTED, text
    stats = kv(run.stdout)
    assert stats["step"] == "ProfilerStep#2" and stats["kernels"] == "10" and stats["syncs"] == "2", run.stdout
    assert stats["graphs"] == "1" and stats["streams"] == "7:0,13:1", run.stdout
    assert float(stats["gpu_ms"]) == pytest.approx((20.3 + 6.04 + 6.01 + 5.97 + 85.3 + 110 + 220 + 30 + 40 + 12) / 1e3,
                                                   abs=1e-3)
    assert "vectorized_elementwise_kernel" in text and "<" not in text.split("\n", 4)[-1]  # names, no templates

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_") and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(build / "sim"), GPUSHARE_SIM_STATE=str(tmp_path / "sim.state"))
    replay = subprocess.run([str(build / "gpushare-probe"), "replay", "--trace", str(out), "--seconds", "0.5"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    got = kv(replay.stdout)
    assert int(got["steps"]) >= 5 and got["graphs"] == "1", replay.stdout  # a 9.85 ms step: about 50 in 0.5 s
    assert float(got["step_gpu_ms"]) == pytest.approx(0.535, abs=0.002), replay.stdout  # the rounded kernels


def test_another_step_and_a_step_without_a_sync(tmp_path):
    ops, stats = tfp.convert(tfp.load_events(profile()), step="1")
    lines, _ = tfp.render(ops)
    assert ops_of("\n".join(lines)) == ["kernel 1000 host=100", "host 96", "sync"], lines
    assert stats["step"] == "ProfilerStep#1" and stats["added_sync"] == 0, stats
    events = [e for e in profile()["traceEvents"] if e.get("name") != "cudaDeviceSynchronize" or e["ts"] > 2000]
    ops, stats = tfp.convert(tfp.load_events({"traceEvents": events}), step="1")
    lines, _ = tfp.render(ops)
    assert ops_of("\n".join(lines)) == ["kernel 1000 host=100", "idle 800", "sync"], lines
    assert stats["added_sync"] == 1, stats
    with pytest.raises(SystemExit, match="no ProfilerStep#7"):
        tfp.convert(tfp.load_events(profile()), step="7")


def test_too_many_kinds_of_kernel_go_onto_coarser_steps():
    """the probe takes 128 kinds (length and grid): 400 kernels of different lengths must fit"""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": PID, "tid": MAIN, "ts": 0,
               "dur": 1e6}]
    for i in range(400):
        events += [call("cudaLaunchKernel", 100 + 10 * i, 2, i),
                   kernel(100 + 10 * i, 5 + 3.7 * i, i, (1 + i % 100, 1, 1))]
    events.append(call("cudaDeviceSynchronize", 9000, 1, 999))
    ops, _ = tfp.convert(tfp.load_events({"traceEvents": events}))
    lines, kinds = tfp.render(ops)
    assert kinds <= 120 and len(ops_of("\n".join(lines))) >= 2, kinds
    seen = {(m.group(1), m.group(2)) for line in lines if (m := re.match(r"kernel (\S+)(?: grid=(\d+))?", line))}
    assert len(seen) == kinds
