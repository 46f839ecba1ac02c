"""MIG profiles as the simulated NVML reports them (hook/sim/sim_mig.c: NVIDIA's H100 80GB and
A100 80GB tables), read once in a child process through dra_driver.mig, the plugin's own code."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pynvml

from dra_driver.hookpath import native_paths
from dra_driver.mig import MigProfile
from kubeletplugin.claimref import ClaimRef
from playground.claims import make_claim, result
from tests.support.nvml import sim_nvml_env

REPO = Path(__file__).parents[2]


@functools.cache
def sim_profiles(product: str = "H100-80GB") -> tuple[MigProfile, ...]:
    sim_dir = str(Path(native_paths()["sim_nvml"]).parent)
    script = ("import dataclasses, json, pynvml; from dra_driver.discovery import load_nvml; "
              f"from dra_driver.mig import read_profiles; load_nvml({sim_dir!r}); pynvml.nvmlInit(); "
              "print(json.dumps([dataclasses.asdict(p) for p in "
              "read_profiles(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))]))")
    with tempfile.TemporaryDirectory(prefix="gsmig") as folder:
        env = sim_nvml_env(Path(folder) / "sim.state", 1, 80 << 30) | {
            "GPUSHARE_SIM_MIG": "0", "GPUSHARE_SIM_MIG_PRODUCT": product}
        out = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                             timeout=60, check=True)
    return tuple(MigProfile(**{**p, "placements": tuple(p["placements"])}) for p in json.loads(out.stdout))


def mig_gpu(gpu, product: str = "H100-80GB"):
    """`gpu` (a GpuInfo) in MIG mode with the product's profiles."""
    return dataclasses.replace(gpu, mig_mode=True, mig_profiles=sim_profiles(product))


# Claims sharing one MIG instance in capacity mode on the agent suites' nodes (tests/agent/conftest.py mig_node)
MIG_GPU = 3  # the nodes' last GPU (they have 4): in MIG mode for a test, back after
INSTANCE = f"gpu-{MIG_GPU}-mig-1g-10gb-0"  # 1g.10gb at memory slice 0


def set_mig_mode(on: bool) -> bool:
    """The operator's `nvidia-smi -i 3 -mig 1|0`, on the simulated NVML the node's agent loaded in
    this process; whether it was on before."""
    gpu = pynvml.nvmlDeviceGetHandleByIndex(MIG_GPU)
    was = bool(pynvml.nvmlDeviceGetMigMode(gpu)[0])
    if was != on:
        pynvml.nvmlDeviceSetMigMode(gpu, int(on))
    return was


def share_instance(node: Any, memory: str, compute: int) -> tuple[ClaimRef, list[str]]:
    """A claim of `memory` and `compute` % of the 1g.10gb instance, prepared; (ref, CDI ids)."""
    ref = make_claim(node.api, [result(INSTANCE, consumed={"memory": memory, "compute": str(compute)})])
    answer = node.kubelet.prepare(ref).claims[ref.uid]
    assert not answer.error, answer.error
    node.mig_claims.append(ref)
    return ref, [i for d in answer.devices for i in d.cdi_device_ids]


def device_uuid(node: Any, ref: ClaimRef) -> str:
    """The device the claim's containers see (its CDI spec's CUDA_VISIBLE_DEVICES)."""
    with open(os.path.join(node.dirs.cdi, f"k8s.gpushare.dev-claim_{ref.uid}.json")) as f:
        spec = json.load(f)
    return dict(e.split("=", 1) for e in spec["containerEdits"]["env"])["CUDA_VISIBLE_DEVICES"]


__all__ = ["INSTANCE", "MIG_GPU", "device_uuid", "mig_gpu", "set_mig_mode", "share_instance", "sim_profiles"]
