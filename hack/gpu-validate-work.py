#!/usr/bin/env python3
"""The GPU workloads of hack/gpu-validate.sh (PyTorch; JAX and Triton where installed).

    gpu-validate-work.py KIND SECONDS [--at EPOCH] [--profile FILE]
    gpu-validate-work.py solo KIND[,KIND...] SECONDS [--profile-dir DIR]
    gpu-validate-work.py oom          PyTorch allocations until OutOfMemoryError: total= free= oom= held=
    gpu-validate-work.py facts [MODULE,...]   one JSON line: versions, PyTorch's GPU name and SM count

KIND:
    matmul       4096 x 4096 fp32 matrix products, flat out
    elementwise  x.mul_(0.999).add_(0.001) on 1M floats from a Python loop (launch-bound)
    graph        a matmul captured with torch.cuda.graph, replayed flat out
    compile      torch.compile(mode="reduce-overhead") of relu(x @ x)
    triton       a Triton kernel of 64 multiply-adds over 64M floats
    jax          a jax.jit matmul loop (in a process of its own: JAX and PyTorch apart)
    infer        a batch-1 fp16 MLP, 8 x 4096, flat out (small kernels: MPS's case)
    serve        the same MLP as a server: a request, waited for, every ~2 ms; latency p50/p99
    train        a decoder-only transformer training step (8 layers, d_model 1024, 16 heads,
                 sequence 512, batch 8, vocabulary 32000; bf16 autocast, AdamW; random tokens made
                 on the host each step, the loss read with .item())

Prints key=value lines: iters= seconds= per_s= (serve: also requests= p50_ms= p99_ms=; train:
iters are steps). A run does a few steps (warm-up), then counts the steps it launches in its
window of SECONDS over the time until they are done (per_s); --at EPOCH: the window begins at
that time.time(), the process working until then (two processes measured
together start their windows together; late_s= says how late this one was ready). With solo,
each kind runs in turn in this one process (one start for all), each line begins kind=KIND, and a
kind that fails prints kind=KIND error=... and the next still runs. --profile FILE (--profile-dir
DIR: DIR/KIND.json for train, elementwise and serve): after the window, five steps under
torch.profiler (two skipped, three recorded, each a ProfilerStep: a training step, 500 elementwise
iterations and a sync, one request), exported with export_chrome_trace for
hack/trace-from-profile.py.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

PROFILED = ("train", "elementwise", "serve")


@dataclass
class Work:
    step: Callable[[], object]       # one unit of work, counted
    sync: Callable[[], object]       # wait for the GPU
    prof_step: Callable[[], object]  # one profiled step, ending in a sync
    latency: bool = False            # step() waits for its answer: report p50/p99


def torch_work(kind: str) -> Work:
    import torch

    dev = "cuda"
    sync = torch.cuda.synchronize
    if kind in ("matmul", "graph", "compile"):
        a = torch.randn(4096, 4096, device=dev)
        if kind == "matmul":
            def mm() -> None:
                a.copy_(a @ a / 4096.0)
            return Work(mm, sync, lambda: (mm(), sync()))
        if kind == "graph":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    a @ a
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):  # cudaErrorStreamCaptureInvalidated if the library breaks it
                out = a @ a  # held: the graph's output lives in its pool
            held = [out]
            return Work(lambda: (g.replay(), held), sync, lambda: (g.replay(), sync()))
        f = torch.compile(lambda x: torch.relu(x @ x) / 4096.0, mode="reduce-overhead")
        return Work(lambda: f(a), sync, lambda: (f(a), sync()))
    if kind == "elementwise":
        e = torch.randn(1 << 20, device=dev)

        def ew() -> None:
            e.mul_(0.999).add_(0.001)

        def ew_step() -> None:
            for _ in range(500):
                ew()
            sync()
        return Work(ew, sync, ew_step)
    if kind == "triton":
        import triton
        import triton.language as tl

        @triton.jit
        def k(x_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            x = tl.load(x_ptr + i, mask=m)
            for _ in range(64):
                x = x * 0.999 + 0.001
            tl.store(x_ptr + i, x, mask=m)
        big = torch.randn(1 << 26, device=dev)

        def tk() -> None:
            k[(big.numel() // 1024,)](big, big.numel(), BLOCK=1024)
        return Work(tk, sync, lambda: (tk(), sync()))
    if kind in ("infer", "serve"):
        layers = [torch.randn(4096, 4096, device=dev, dtype=torch.half) / 64 for _ in range(8)]
        x = torch.randn(1, 4096, device=dev, dtype=torch.half)

        def forward() -> None:
            y = x
            for w in layers:
                y = torch.relu(y @ w)
        if kind == "infer":
            return Work(forward, sync, lambda: (forward(), sync()))

        def request() -> None:
            forward()
            sync()

        def served() -> None:
            request()
            time.sleep(0.002)
        return Work(request, sync, served, latency=True)
    if kind == "train":
        return train_work()
    raise SystemExit(f"gpu-validate-work: unknown kind {kind}")


def train_work(layers: int = 8, d: int = 1024, heads: int = 16, seq: int = 512, batch: int = 8,
               vocab: int = 32000) -> Work:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
            return x + self.down(F.gelu(self.up(self.n2(x))))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    model = Decoder().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        tokens = torch.randint(0, vocab, (batch, seq + 1)).pin_memory()  # the host's batch
        t = tokens.to("cuda", non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(t[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab), t[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # the sync a training loop's logging makes
    return Work(step, torch.cuda.synchronize, step)


def jax_work() -> Work:
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda a: (a @ a) / 4096.0)
    state = {"x": jnp.ones((4096, 4096), jnp.float32)}

    def step() -> None:
        state["x"] = f(state["x"])

    def sync() -> None:
        state["x"].block_until_ready()
    return Work(step, sync, lambda: (step(), sync()))


def measure(w: Work, seconds: float, at: float = 0.0, warmup: int = 3) -> str:
    """the key=value line of a window: the steps launched in `seconds`, over the time until they
    are done"""
    for _ in range(warmup):
        w.step()
    w.sync()
    late = max(0.0, time.time() - at) if at else 0.0
    while at and time.time() < at:  # ready early: keep the GPU busy as in the window
        w.step()
    w.sync()
    t0 = time.time()
    end = t0 + seconds
    n, lat = 0, []
    while time.time() < end:
        s = time.perf_counter()
        w.step()
        n += 1
        if w.latency:
            lat.append((time.perf_counter() - s) * 1e3)
            time.sleep(0.002)
    w.sync()
    took = time.time() - t0
    out = f"iters={n} seconds={took:.3f} per_s={n / took:.3f}"
    if at:
        out += f" late_s={late:.3f}"
    if lat:
        lat.sort()
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        out += f" requests={len(lat)} p50_ms={lat[len(lat) // 2]:.3f} p99_ms={p99:.3f}"
    return out


def profile(w: Work, path: str) -> None:
    from torch.profiler import ProfilerActivity, schedule
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                       schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                       on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(5):
            w.prof_step()
            prof.step()  # the fifth ends the three recorded steps: the trace is written
    if not os.path.exists(path):
        raise RuntimeError(f"torch.profiler wrote no trace to {path}")


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}:{str(e).strip().splitlines()[0] if str(e).strip() else ''}".replace(" ", "_")[:300]


def facts(modules: list[str]) -> dict:
    """the workload python's versions and what PyTorch says of the GPU"""
    import platform

    out: dict = {"python": platform.python_version()}
    for m in modules:
        try:
            mod = __import__(m)
            out[m] = getattr(mod, "__version__", "?")
            if m == "torch":
                import torch

                out["torch_cuda"] = torch.version.cuda
                out["cudnn"] = torch.backends.cudnn.version()
                p = torch.cuda.get_device_properties(0)
                out.update(device=p.name, sm_count=p.multi_processor_count, memory_bytes=p.total_memory,
                           capability=f"{p.major}.{p.minor}")
        except Exception as e:  # what is missing is a fact too
            out[f"{m}_error"] = one_line(e)
    return out


def oom() -> None:
    """allocate 128 MiB blocks until PyTorch raises OutOfMemoryError (section 2)"""
    import torch

    free, total = torch.cuda.mem_get_info()
    print(f"total={total} free={free}", flush=True)
    blocks = []
    try:
        while True:
            blocks.append(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        print(f"oom=1 held={len(blocks) * (128 << 20)}", flush=True)


def main(argv: list[str]) -> int:
    args, opts = [], {}
    it = iter(argv)
    for a in it:
        if a.startswith("--"):
            opts[a[2:]] = next(it, "")
        else:
            args.append(a)
    if args[:1] == ["facts"]:
        import json

        print(json.dumps(facts(args[1].split(",") if len(args) > 1 else ["torch"])), flush=True)
        return 0
    if args == ["oom"]:
        oom()
        return 0
    if len(args) == 3 and args[0] == "solo":
        kinds, seconds = args[1].split(","), float(args[2])
        if "jax" in kinds and len(kinds) > 1:
            raise SystemExit("gpu-validate-work: jax runs in a process of its own")
        for kind in kinds:
            try:
                w = jax_work() if kind == "jax" else torch_work(kind)
                print(f"kind={kind} {measure(w, seconds)}", flush=True)
                if opts.get("profile-dir") and kind in PROFILED:
                    path = os.path.join(opts["profile-dir"], f"{kind}.json")
                    t = time.time()
                    profile(w, path)
                    print(f"kind={kind} profile={path} profile_s={time.time() - t:.1f}", flush=True)
            except Exception as e:  # a kind that fails is a row; the others still run
                traceback.print_exc()
                print(f"kind={kind} error={one_line(e)}", flush=True)
        return 0
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 64
    kind, seconds = args[0], float(args[1])
    w = jax_work() if kind == "jax" else torch_work(kind)
    print(measure(w, seconds, float(opts.get("at") or 0)), flush=True)
    if opts.get("profile"):
        profile(w, opts["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
