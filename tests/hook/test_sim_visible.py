"""A container sees only its claims' GPUs, numbered from 0, as CUDA and NVML number the device
nodes a real spec gives it. The simulator has no device nodes: a claim's spec names its GPUs in
GPUSHARE_SIM_VISIBLE_<claim> (hook/sim/sim_state.h). Before, every process saw every simulated GPU,
so a probe's default device was the claim's only when the claim happened to land on GPU 0."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from dra_driver.hookpath import native_paths
from kubeletplugin.cdispec import SimDriver
from kubeletplugin.prepared import PreparedClaim, PreparedGpu
from tests.support.hook import kv
from tests.support.nvml import needs_sim, sim_nvml_env

pytestmark = needs_sim
GiB = 1 << 30


def sim_env(tmp_path: Path, **visible: str) -> dict[str, str]:
    """Three simulated GPUs; `visible`: claim -> its GPUs, as the plugin's spec names them."""
    return sim_nvml_env(tmp_path / "sim.state", 3, 16 * GiB) | {
        "LD_LIBRARY_PATH": native_paths()["sim_dir"],
        **{f"GPUSHARE_SIM_VISIBLE_{claim}": gpus for claim, gpus in visible.items()}}


def probe(tmp_path: Path, *args: str, **visible: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([native_paths()["probe"], *args], env=sim_env(tmp_path, **visible), capture_output=True,
                          text=True, timeout=30)


def uuid(i: int) -> str:
    return f"GPU-5ea1c0de-0000-4000-8000-{i:012x}"


def test_a_process_sees_its_claims_gpus_from_0_and_no_other(tmp_path):
    assert probe(tmp_path, "gpus").stdout.splitlines() == [  # the host: every GPU
        f"GPU {i}: NVIDIA Simulated GPU (UUID: {uuid(i)})" for i in range(3)]
    assert probe(tmp_path, "gpus", a="2").stdout.splitlines() == [f"GPU 0: NVIDIA Simulated GPU (UUID: {uuid(2)})"]
    # two claims: the GPUs of both, in the host's order
    assert probe(tmp_path, "gpus", a="2", b="0").stdout.splitlines() == [
        f"GPU 0: NVIDIA Simulated GPU (UUID: {uuid(0)})", f"GPU 1: NVIDIA Simulated GPU (UUID: {uuid(2)})"]
    # another GPU cannot be opened: CUDA has no second ordinal
    other = probe(tmp_path, "--device", "1", "meminfo", a="2")
    assert other.returncode != 0 and "CUDA_ERROR_INVALID_DEVICE" in other.stdout + other.stderr
    # what a process does on its ordinal 0 is done on the claim's GPU: the host sees it there
    held = subprocess.Popen([native_paths()["probe"], "alloc", "--chunk", str(GiB), "--max", str(GiB),
                             "--hold", "30"], env=sim_env(tmp_path, a="1"), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            used = {i: int(kv(probe(tmp_path, "--device", str(i), "meminfo").stdout)["nvml_used"]) for i in range(3)}
            if used[1] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert used == {0: 0, 1: GiB, 2: 0}
    finally:
        held.kill()
        held.wait()


def test_the_plugins_spec_for_the_simulator_names_the_claims_gpus():
    gpus = [PreparedGpu(index=i, uuid=uuid(i), minor=i, memory_limit=GiB, compute_limit=50) for i in (2, 0)]
    claim = PreparedClaim(namespace="default", name="c", uid="0b7a-11", gpus=tuple(gpus), devices=())
    assert SimDriver.visible(claim) == "GPUSHARE_SIM_VISIBLE_0b7a_11=2,0"
