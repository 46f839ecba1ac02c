"""`gpushare-dra share-agent RUN_DIR...`: the node agent's slot scheduling (shares.py) for claims
laid out with GPUSHARE_RUN_DIR (limits, region/<i>, control/<i>) instead of by the kubelet
plugin: for hack/bench-share and hack/gpu-validate.sh, which run the library and the agent as a
cluster does, without one. Control files missing from a run dir are created, as the plugin does.

Each claim's processes on each GPU (the control file's `procs`) are counted as the plugin's agent
counts them, the processes NVML lists on the GPU that belong to the claim, but without a cluster's
facts (cgroups, reservedFor, bind mounts) a process belongs to the claims whose region file of
that GPU it maps (/proc/<pid>/maps, by device and inode): the kernel's word, which the library
needs to pace at all. A process's environment and the region's slots are its own to rewrite, so a
tenant could hide from them and be counted fewer, which raises a forging claim's private rate
(rate / procs); a mapping it cannot hide, and mapping another claim's region only counts it there
too (more processes only lower a forger's rate). Needs NVML (the simulated one where the agent
runs with the claims' GPUSHARE_SIM_STATE and LD_LIBRARY_PATH) and the processes' maps (root, or
the tenants' user); without NVML no count is written (0: the library takes one).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dra_driver.config import MPS
from dra_driver.flags import FromArgs
from dra_driver.log import get_logger
from dra_driver.runloop import serve
from kubeletplugin.hooklayout import CONTROL_SIZE

from .control import Control
from .procmap import map_key, mapped_files
from .regions import Region
from .relay import Relay, fill_pairs
from .shares import Share, plan_gpu

if TYPE_CHECKING:
    from .sampler import Sampler

log = get_logger("agent.standalone")


class RunDirClaim:
    """One run dir's paced GPUs: (uuid, share, region, control) each."""

    def __init__(self, root: str):
        kv = {}
        with open(os.path.join(root, "limits")) as f:
            for line in f:
                key, sep, value = line.strip().partition("=")
                if sep and not key.startswith("#"):
                    kv[key] = value
        self.gpus = []
        self.map_keys: list[tuple[str, int] | None] = []  # per GPU: its region file, as maps shows it
        for i in range(int(kv.get("GPUSHARE_GPU_COUNT", "1"))):
            limit = int(kv.get(f"GPUSHARE_COMPUTE_LIMIT_{i}", "100"))
            if limit >= 100:  # never paced
                continue
            path = os.path.join(root, "control", str(i))
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.truncate(CONTROL_SIZE)
            share = Share(limit=limit / 100.0, burst=kv.get(f"GPUSHARE_COMPUTE_POLICY_{i}") == "Burst", trusted=True)
            region = Region(os.path.join(root, "region", str(i)))
            self.gpus.append((kv.get(f"GPUSHARE_DEVICE_UUID_{i}", str(i)), share, region, Control(path)))
            # how a process's maps shows this region file
            self.map_keys.append(map_key(region.path))
        self.mps = kv.get("GPUSHARE_SHARING_STRATEGY") == MPS
        self.charged = [0] * len(self.gpus)


class ProcessList(Protocol):
    """NVML's processes on each GPU (sampler.Sampler)."""

    def process_memory(self, uuids: Collection[str] | None = None) -> dict[str, dict[int, int]]: ...


def count_processes(claims: list[RunDirClaim], nvml: ProcessList) -> None:
    """Each claim's processes on each of its paced GPUs (`Share.procs`, written by the plan): the
    pids NVML lists on the GPU that map the claim's region file of it. A GPU whose query failed
    keeps its last count (unread is not empty)."""
    on_gpu = nvml.process_memory({uuid for c in claims for uuid, *_ in c.gpus})
    maps = {pid: mapped_files(pid) for pids in on_gpu.values() for pid in pids}
    for c in claims:
        for (uuid, share, _, _), key in zip(c.gpus, c.map_keys, strict=True):
            if uuid in on_gpu:
                share.procs = sum(key in maps[pid] for pid in on_gpu[uuid]) if key else 0


def tick(claims: list[RunDirClaim], seconds: float, relay: Relay | None = None,
         nvml: ProcessList | None = None) -> None:
    """One period: each claim's charged GPU time and processes (none counted: no NVML), then every
    GPU's slots and rates, and the fill relay's pairs (none: no relay)."""
    if nvml is not None:
        count_processes(claims, nvml)
    on_gpu: dict[str, list[Share]] = {}
    time_sliced: set[str] = set()
    for c in claims:
        for j, (uuid, share, region, _) in enumerate(c.gpus):
            h = region.counters()
            if h.kernel_us:
                region.clear_kernel_us()
            share.count(h.charged_ns - c.charged[j], seconds, h.kernel_us)
            c.charged[j] = h.charged_ns
            on_gpu.setdefault(uuid, []).append(share)
            if not c.mps:
                time_sliced.add(uuid)
    for uuid, shares in on_gpu.items():  # as the node agent's period (agent.py)
        plan_gpu(shares, mps_only=uuid not in time_sliced)
    for c in claims:
        for _, share, _, control in c.gpus:
            control.plan(share)
    if relay is not None:
        relay.watch(fill_pairs([gpu for c in claims for gpu in c.gpus]))


def open_nvml() -> Sampler | None:
    """NVML as this process finds it (libnvidia-ml.so.1 on the loader's path: the simulated one
    in hook/build/sim with LD_LIBRARY_PATH and GPUSHARE_SIM_STATE); None, said once, without it."""
    try:
        from .sampler import Sampler

        return Sampler()
    except Exception as e:  # no NVML (library, driver or bindings): the claims run with procs unknown
        log.warning("NVML unavailable: the claims' processes on each GPU are not counted (procs 0)", error=str(e))
        return None


class ShareAgent:
    """Runs `tick` every `interval` seconds on a thread; `stop` zeroes every rate and slot, so
    the claims' processes run unpaced once the agent is gone (docs/interfaces.md)."""

    def __init__(self, claims: list[RunDirClaim], interval: float) -> None:
        self.claims = claims
        self.interval = interval
        self.relay = Relay()
        self.nvml = open_nvml()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="share-agent", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            tick(self.claims, now - last, self.relay, self.nvml)
            last = now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.relay.stop()
        if self.nvml is not None:
            self.nvml.close()
        for c in self.claims:
            for _, _, region, control in c.gpus:
                control.unplan()
                control.close()
                region.close()


@dataclass(frozen=True)
class ShareAgentConfig(FromArgs):
    """What `gpushare-dra share-agent` is started with."""

    run_dirs: tuple[str, ...]
    interval: float = 0.25

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_dirs", tuple(self.run_dirs))  # argparse gives a list


def run(args: argparse.Namespace) -> int:
    return run_share_agent(ShareAgentConfig.from_args(args))


def run_share_agent(config: ShareAgentConfig) -> int:
    def start() -> ShareAgent:
        claims = [RunDirClaim(d) for d in config.run_dirs]  # in the order given: the slots' order
        log.info("share agent running", claims=len(claims), interval=config.interval)
        return ShareAgent(claims, config.interval)

    # SIGTERM (bench-share, gpu-validate.sh) and Ctrl-C both stop it through `stop`.
    return serve(start, log, "share agent stopping")
