"""Helpers of the enforcement library's tests: claims laid out per docs/interfaces.md (a run
dir with limits, regions and control files) and processes run in them against the simulated
driver (hook/build/sim) with libgpushare.so preloaded. The fixtures are in tests/hook/conftest.py.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kubeletplugin.hooklayout import (
    CONTROL,
    CONTROL_MAGIC,
    CONTROL_SIZE,
    CONTROL_VERSION,
    HEADER_SIZE,
    REGION_HEADER,
    REGION_SIZE,
    SIM_MPS_HELD,
)

from . import REPO, wait_for

HOOK = REPO / "hook"
UUID_PREFIX = "GPU-5ea1c0de-0000-4000-8000-"


def sim_uuid(i: int) -> str:
    return f"{UUID_PREFIX}{i:012x}"


def make_hook(*targets: str) -> None:
    subprocess.run(["make", "-s", "-C", str(HOOK), *targets], check=True, timeout=600)


@dataclass
class Claim:
    """A run dir ($GPUSHARE_RUN_DIR) with a limits file and zero-filled regions, plus the
    environment a process of the claim runs with."""

    root: Path
    build: Path
    env: dict = field(default_factory=dict)

    @property
    def limits(self) -> Path:
        return self.root / "limits"

    def region(self, i: int = 0) -> Path:
        return self.root / "region" / str(i)

    def write_control(self, rate_ppm: int, i: int = 0, magic: int = CONTROL_MAGIC, version: int = CONTROL_VERSION,
                      slot: tuple[int, int, int] = (0, 0, 0), procs: int = 0) -> None:
        """The node agent's control file (hook/src/control.h): header, the rate, the claim's
        time slot (period_us, start_us, length_us; zeros: none) and its process count (0: unknown)."""
        path = self.root / "control" / str(i)
        path.parent.mkdir(exist_ok=True)
        period, start, length = slot
        data = bytearray(CONTROL_SIZE)
        for name, value in (("magic", magic), ("version", version), ("rate_ppm", rate_ppm),
                            ("slot", start | length << 32), ("period_us", period), ("procs", procs)):
            CONTROL[name].write(data, value)
        path.write_bytes(data)

    @contextlib.contextmanager
    def forging(self, values: dict[str, int], every_s: float, i: int = 0) -> Iterator[None]:
        """A tenant of the claim writing `values` (region header fields, in order) into region i
        every every_s seconds, while the block runs."""
        stop = threading.Event()

        def forge() -> None:
            with open(self.region(i), "r+b") as f, mmap.mmap(f.fileno(), HEADER_SIZE) as m:
                while not stop.is_set():
                    for name, value in values.items():
                        REGION_HEADER[name].write(m, value)  # an mmap takes slice stores as a bytearray does
                    stop.wait(every_s)

        t = threading.Thread(target=forge)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()

    def run(self, *args, preload=True, env=None, timeout=60, check=True, build=None):
        b = build or self.build
        e = dict(self.env)
        if preload:
            e["LD_PRELOAD"] = str(b / "libgpushare.so")
        e.update(env or {})
        exe = str(args[0]) if str(args[0]).startswith("/") else str(b / args[0])
        p = subprocess.run([exe, *map(str, args[1:])], env=e, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{args} failed rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    def popen(self, *args, env=None):
        e = dict(self.env, LD_PRELOAD=str(self.build / "libgpushare.so"))
        e.update(env or {})
        return subprocess.Popen([str(self.build / args[0]), *map(str, args[1:])], env=e,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def write_limits(path: Path, gpus: list[dict], extra: str = "") -> None:
    lines = ["# gpushare limits (test)", "GPUSHARE_LIMITS_VERSION=1",
             "GPUSHARE_CLAIM_UID=3f1c2a9e-6f0b-4d5e-9a43-2f5c0b7d9e11", f"GPUSHARE_GPU_COUNT={len(gpus)}"]
    for i, g in enumerate(gpus):
        lines.append(f"GPUSHARE_DEVICE_UUID_{i}={g.get('uuid', sim_uuid(i))}")
        lines.append(f"GPUSHARE_MEMORY_LIMIT_{i}={g['memory']}")
        lines.append(f"GPUSHARE_COMPUTE_LIMIT_{i}={g.get('compute', 100)}")
        lines.append(f"GPUSHARE_COMPUTE_POLICY_{i}={g.get('policy', 'Hard')}")
    path.write_text("\n".join(lines) + "\n" + extra)


def new_claim(folder: Path, build: Path, gpus: list[dict], name: str = "claim", sim: dict | None = None) -> Claim:
    """The claim folder/name (limits for `gpus`, see write_limits, and zero-filled regions, as the
    kubelet plugin creates them) and its processes' environment: the library of `build` on the
    simulated driver whose GPUs' state is folder/sim.state, plus `sim`."""
    root = folder / name
    (root / "region").mkdir(parents=True)
    write_limits(root / "limits", gpus)
    for i in range(len(gpus)):
        with open(root / "region" / str(i), "wb") as f:
            f.truncate(REGION_SIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env.update({
        "GPUSHARE_RUN_DIR": str(root),
        "GPUSHARE_SIM_STATE": str(folder / "sim.state"),
        "LD_LIBRARY_PATH": str(build / "sim"),
    })
    env.update(sim or {})
    return Claim(root, build, env)


def kv(text: str) -> dict:
    """key=value pairs of the last line that has each key"""
    out = {}
    for k, v in re.findall(r"(\w+)=(\S+)", text):
        out[k] = v
    return out


MPS_HELD = SIM_MPS_HELD  # the simulated MPS's held factor (kubeletplugin/hooklayout.py)


def throughput(out: dict, kernel_us: float) -> float:
    """GPU work a `gpushare-probe launch` did within its window, as a fraction of the GPU's solo
    speed (kernels of kernel_us each)."""
    return int(out["done_in_window"]) * kernel_us / 1e6 / float(out["window_s"])


def slot_length(claim: Claim) -> int:
    """the length of the claim's slot on GPU 0 in its control file (0: none yet)"""
    path = claim.root / "control" / "0"
    return CONTROL["slot"].read(path.read_bytes()) >> 32 if path.exists() else 0


@contextlib.contextmanager
def share_agent(claims: list[Claim]) -> Iterator[None]:
    """`gpushare-dra share-agent` over the claims' run dirs, with the simulated NVML their processes
    use (the claims' environment less GPUSHARE_RUN_DIR), once it has written their slots."""
    env = {k: v for k, v in claims[0].env.items() if k != "GPUSHARE_RUN_DIR"}
    agent = subprocess.Popen([sys.executable, "-m", "dra_driver.cli", "share-agent", "--interval", "0.25",
                              "--log-level", "warning", *(str(c.root) for c in claims)], cwd=REPO, env=env,
                             stderr=subprocess.PIPE, text=True)
    try:  # a library that starts before its control file has a slot runs without slots for its life
        wait_for(lambda: agent.poll() is not None or all(slot_length(c) for c in claims), timeout=30,
                 what="the agent's slots")
        assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
        yield
    finally:
        agent.terminate()
        _, err = agent.communicate(timeout=30)
    assert "NVML unavailable" not in err, err
