#!/usr/bin/env python3
"""Convert a torch.profiler chrome trace into a gpushare-probe replay trace (hook/traces/*.trace).

    trace-from-profile.py PROFILE.json[.gz] [-o OUT.trace] [--step last|N|all] [--sms N]
                          [--idle-over US] [--title TEXT]

PROFILE is what torch.profiler's export_chrome_trace writes (activities CPU and CUDA; a
schedule with prof.step() marks the steps as ProfilerStep#N). The trace is one step of the
workload, by default the last ProfilerStep (--step N: ProfilerStep#N; all: everything profiled,
also a profile without step marks). Each GPU operation a CUDA runtime or driver call of the step
launched (found by the call's correlation id, wherever the GPU ran it) becomes a line:

    kernel US [grid=BLOCKS] [stream=S] [host=US]

US its GPU time; grid= the kernel's blocks (its launch's grid x*y*z) when fewer than --sms (the
GPU's SM count, 132 by default; a kernel of at least that many fills the GPU and is written
without grid=, which the probe reads as the replaying GPU's SM count); memory copies and sets
are kernels of their length that fill the GPU; stream= the CUDA stream, mapped to 0..7 (the
stream most kernels ran on is 0, the legacy stream, PyTorch's default; the others 1..7 in the
order they first appear, wrapping round past 7); host= the time from the end of the previous
CUDA call the trace kept (or the step's start) to this launch: the framework's CPU work between
launches. A graph launch (cudaGraphLaunch) with several kernels becomes `graph begin`, its
kernels, `graph end` (16 graphs at most, the probe's limit; later ones are plain kernels).
cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize, a blocking cudaMemcpy (a
tensor's .item()) and their driver forms become `sync`; a gap before a sync, and the step's tail
after its last call, become `host US`, or `idle US` when the gap is at least --idle-over
microseconds (500 by default) and no profiled CPU op covers half of it (the thread slept:
time.sleep, waiting for a request). Calls from every thread of the step are taken in time order
(PyTorch's backward launches from the autograd engine's thread while the main one waits).

Times are rounded to two significant digits so that repeated launches compress (`xN`); if the
step still has more than 120 kinds of kernel (length and grid; the probe takes 128), lengths go
onto coarser geometric steps and small grids onto powers of two until it fits. A step with no
sync gets one at its end (a trace needs one). The summary goes to stdout as key=value pairs:
kernels= gpu_ms= step_ms= busy_share= syncs= graphs= kinds= lines= streams=.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
CALL_CATS = {"cuda_runtime", "cuda_driver"}
CPU_CATS = {"cpu_op", "python_function", "user_annotation"}
SYNC_CALLS = {
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D",
    "cudaMemcpyFromSymbol", "cudaMemcpyToSymbol", "cudaMemset", "cudaMemset2D",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemcpy", "cuMemcpyDtoH",
    "cuMemcpyHtoD", "cuMemcpyDtoD", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoD_v2",
}
MAX_KINDS = 120      # the probe's replay takes 128 kinds of kernel (length and grid)
MAX_GRAPHS = 16      # and 16 graphs
MAX_OPS = 65536      # and 65,536 ops a step
STREAMS = 8


@dataclass
class Gpu:
    ts: float
    us: float
    blocks: int | None  # None: fills the GPU (a copy, a graph node without its grid)
    stream: int
    name: str


@dataclass
class Op:
    kind: str           # kernel | host | idle | sync | graph-begin | graph-end
    us: float = 0.0
    blocks: int | None = None
    stream: int = 0
    host: float = 0.0
    in_graph: bool = False
    name: str = ""


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return load_events(json.load(f))


def load_events(data: dict | list) -> list[dict]:
    """the complete events (ph X) of a chrome trace's JSON"""
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]


def short_name(name: str) -> str:
    name = re.sub(r"^void ", "", name)
    name = re.split(r"[<(]", name, maxsplit=1)[0].strip()
    return name[-48:] if len(name) > 48 else name


def blocks_of(args: dict) -> int | None:
    grid = args.get("grid")
    if isinstance(grid, list | tuple) and grid and all(isinstance(g, int | float) for g in grid):
        return int(math.prod(int(g) for g in grid))
    return None


def pick_step(events: list[dict], step: str) -> tuple[float, float, str]:
    """(start, end, label) of the step asked for; end is inf for `all`"""
    marks = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
                    and e.get("cat") in ("user_annotation", "cpu_op", "cpu_instant_event")),
                   key=lambda e: e["ts"])
    if step == "all" or not marks:
        if step not in ("all", "last"):
            raise SystemExit(f"trace-from-profile: no ProfilerStep#{step}: the profile has no step marks")
        return -math.inf, math.inf, "all"
    if step == "last":
        chosen = marks[-1]
    else:
        found = [e for e in marks if e["name"] == f"ProfilerStep#{step}"]
        if not found:
            have = ", ".join(e["name"] for e in marks)
            raise SystemExit(f"trace-from-profile: no ProfilerStep#{step} (the profile has {have})")
        chosen = found[0]
    return float(chosen["ts"]), float(chosen["ts"]) + float(chosen.get("dur", 0)), chosen["name"]


def covered(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """how much of [lo, hi] the spans cover (merged, so overlapping ops count once)"""
    cuts = sorted((max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi)
    total, end = 0.0, lo
    for a, b in cuts:
        a = max(a, end)
        if b > a:
            total += b - a
            end = b
    return total


def convert(events: list[dict], step: str = "last", sms: int = 132, idle_over: float = 500.0) -> tuple[list[Op], dict]:
    start, end, label = pick_step(events, step)
    gpu: dict[int, list[Gpu]] = {}
    for e in events:
        if e.get("cat") in GPU_CATS:
            args = e.get("args") or {}
            corr = args.get("correlation")
            if corr is None:
                continue
            blocks = blocks_of(args) if e["cat"] == "kernel" else None
            stream = int(args.get("stream", 0) or 0)
            gpu.setdefault(int(corr), []).append(
                Gpu(float(e["ts"]), float(e.get("dur", 0)), blocks, stream, str(e.get("name", ""))))
    calls = sorted((e for e in events if e.get("cat") in CALL_CATS and start <= float(e["ts"]) <= end),
                   key=lambda e: float(e["ts"]))
    if not calls:
        raise SystemExit(f"trace-from-profile: no CUDA runtime calls in {label}: was the profile taken with "
                         "ProfilerActivity.CUDA?")
    cpu_spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                 if e.get("cat") in CPU_CATS and not str(e.get("name", "")).startswith("ProfilerStep#")]
    if label == "all":
        start = float(calls[0]["ts"])

    # the streams: the busiest is 0 (the legacy stream), the others 1..7 by first appearance
    launched = [g for c in calls for g in gpu.get(int((c.get("args") or {}).get("correlation", -1)), [])]
    counts = Counter(g.stream for g in launched)
    order: list[int] = []
    for g in sorted(launched, key=lambda g: g.ts):
        if g.stream not in order:
            order.append(g.stream)
    busiest = counts.most_common(1)[0][0] if counts else 0
    stream_map = {busiest: 0}
    for s in order:
        if s not in stream_map:
            stream_map[s] = (len(stream_map) - 1) % (STREAMS - 1) + 1

    ops: list[Op] = []
    cursor, graphs, syncs = start, 0, 0

    def sleeping(lo: float, hi: float) -> bool:
        return hi - lo >= idle_over and covered(cpu_spans, lo, hi) < (hi - lo) / 2

    def gap_op(lo: float, hi: float) -> None:
        if hi - lo >= 1:
            ops.append(Op("idle" if sleeping(lo, hi) else "host", hi - lo))

    for c in calls:
        ts, dur = float(c["ts"]), float(c.get("dur", 0))
        name = str(c.get("name", ""))
        args = c.get("args") or {}
        mine = sorted(gpu.get(int(args.get("correlation", -1)), []), key=lambda g: g.ts)
        is_sync = name in SYNC_CALLS or name.removesuffix("_v2") in SYNC_CALLS
        if not mine and not is_sync:
            continue  # cudaGetDevice, cudaEventRecord, cudaStreamWaitEvent...: CPU time, in the next gap
        host = max(0.0, ts - cursor)
        if host >= 1 and (sleeping(cursor, ts) or not mine):  # the thread slept, or a sync's gap
            gap_op(cursor, ts)
            host = 0.0
        if mine:
            if len(mine) > 1 and graphs < MAX_GRAPHS:
                graphs += 1
                if host:
                    gap_op(cursor, ts)
                ops.append(Op("graph-begin"))
                ops.extend(Op("kernel", g.us, g.blocks, 0, 0.0, True, short_name(g.name)) for g in mine)
                ops.append(Op("graph-end"))
            else:
                for i, g in enumerate(mine):
                    ops.append(Op("kernel", g.us, g.blocks, stream_map.get(g.stream, 0), host if i == 0 else 0.0,
                                  False, short_name(g.name)))
            cursor = max(cursor, ts + dur)
        if is_sync:
            ops.append(Op("sync"))
            syncs += 1
            cursor = max(cursor, ts + dur)
    if end != math.inf:
        gap_op(cursor, end)
        step_end = end
    else:
        step_end = cursor
    added_sync = not syncs
    if added_sync:
        ops.append(Op("sync", name="added: the step had none (a trace needs one)"))
    kernels = [o for o in ops if o.kind == "kernel"]
    gpu_us = sum(o.us for o in kernels)
    stats = {
        "step": label, "kernels": len(kernels), "gpu_ms": round(gpu_us / 1e3, 3),
        "step_ms": round((step_end - start) / 1e3, 3),
        "busy_share": round(100 * gpu_us / (step_end - start), 2) if step_end > start else 0.0,
        "syncs": syncs, "graphs": graphs, "added_sync": int(added_sync),
        "streams": ",".join(f"{s}:{stream_map[s]}" for s in sorted(stream_map, key=lambda s: stream_map[s])),
    }
    return ops, stats


def sig2(x: float) -> float:
    """x to two significant digits"""
    if x <= 0:
        return 0.0
    return round(x, 1 - int(math.floor(math.log10(x))))


def on_steps(x: float, ratio: float | None) -> float:
    """x rounded to two significant digits, or onto a geometric ladder of the ratio given"""
    if ratio is None or x <= 0:
        return sig2(x)
    return sig2(ratio ** round(math.log(x) / math.log(ratio)))


def number(x: float) -> str:
    return f"{x:.0f}" if x >= 10 or x == int(x) else f"{x:g}"


def render(ops: list[Op], sms: int = 132) -> tuple[list[str], int]:
    """the trace's op lines (runs of equal lines as xN) and its kinds of kernel"""
    for ratio, pow2 in ((None, False), (1.1, False), (1.25, True), (1.5, True), (2.0, True), (4.0, True)):
        kinds = set()
        lines: list[tuple[str, str]] = []
        for o in ops:
            if o.kind == "kernel":
                us = max(0.5, on_steps(o.us, ratio))
                blocks = o.blocks if o.blocks is not None and o.blocks < sms else None
                if blocks is not None and pow2:
                    blocks = min(sms, 1 << (blocks - 1).bit_length())
                    blocks = None if blocks >= sms else blocks
                kinds.add((us, blocks))
                text = f"kernel {number(us)}"
                if blocks is not None:
                    text += f" grid={blocks}"
                if o.stream and not o.in_graph:
                    text += f" stream={o.stream}"
                host = sig2(o.host)
                if host >= 1 and not o.in_graph:
                    text += f" host={number(host)}"
                lines.append((text, o.name))
            elif o.kind in ("host", "idle"):
                us = sig2(o.us)
                if us >= 1:
                    lines.append((f"{o.kind} {number(us)}", ""))
            elif o.kind == "sync":
                lines.append(("sync", o.name))
            else:
                lines.append(("graph begin" if o.kind == "graph-begin" else "graph end", ""))
        if len(kinds) <= MAX_KINDS:
            break
    else:
        raise SystemExit(f"trace-from-profile: {len(kinds)} kinds of kernel even on the coarsest steps "
                         f"(at most {MAX_KINDS})")
    out: list[str] = []
    i = 0
    while i < len(lines):
        j = i
        while j + 1 < len(lines) and lines[j + 1] == lines[i] and not lines[i][0].startswith("graph"):
            j += 1
        text, name = lines[i]
        if j > i:
            text += f" x{j - i + 1}"
        out.append(f"{text:<40} # {name}" if name else text)
        i = j + 1
    return out, len(kinds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trace-from-profile.py",
                                description=__doc__.split("\n\n", 1)[0],
                                epilog="The format: the comment at the top of hook/tools/gpushare-probe.c; "
                                       "replay: gpushare-probe replay --trace OUT.trace --seconds T",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile", help="torch.profiler chrome trace (JSON, or .json.gz)")
    p.add_argument("-o", "--output", help="the trace to write (default: stdout)")
    p.add_argument("--step", default="last", help="last (default), N (ProfilerStep#N) or all")
    p.add_argument("--sms", type=int, default=132, help="the profiled GPU's SM count (132: H100, H200)")
    p.add_argument("--idle-over", type=float, default=500.0,
                   help="a gap of at least this many us with no CPU op over half of it is idle, not host")
    p.add_argument("--title", default="", help="a line for the trace's heading comment")
    a = p.parse_args(argv)
    ops, stats = convert(load(a.profile), a.step, a.sms, a.idle_over)
    lines, kinds = render(ops, a.sms)
    n_ops = sum(int(m.group(1)) if (m := re.search(r" x(\d+)\b", ln.split("#")[0])) else 1 for ln in lines
                if not ln.startswith("graph"))
    if n_ops > MAX_OPS:
        raise SystemExit(f"trace-from-profile: {n_ops} ops in the step (the probe takes {MAX_OPS})")
    stats.update(kinds=kinds, lines=len(lines))
    head = [f"# gpushare trace from a torch.profiler capture: {a.title}" if a.title else
            "# gpushare trace from a torch.profiler capture",
            f"# source {os.path.basename(a.profile)}, {stats['step']}: {stats['kernels']} GPU ops, "
            f"{stats['gpu_ms']} ms of GPU time",
            f"# in a {stats['step_ms']} ms step ({stats['busy_share']} % busy), {stats['syncs']} syncs, "
            f"{stats['graphs']} graphs; streams (CUDA:trace) {stats['streams']}",
            f"# times rounded by hack/trace-from-profile.py; {kinds} kinds of kernel",
            "# replay: gpushare-probe replay --trace FILE --seconds T"]
    text = "\n".join(head + lines) + "\n"
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print(" ".join(f"{k}={v}" for k, v in stats.items()), file=sys.stdout if a.output else sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
