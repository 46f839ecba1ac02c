"""MIG profiles as the simulated NVML reports them (hook/sim/sim_mig.c: NVIDIA's H100 80GB and
A100 80GB tables), read once in a child process through dra_driver.mig, the plugin's own code."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from dra_driver.hookpath import native_paths
from dra_driver.mig import MigProfile
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


__all__ = ["mig_gpu", "sim_profiles"]
