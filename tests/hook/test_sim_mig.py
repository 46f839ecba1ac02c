"""The simulated NVML and CUDA in MIG mode (hook/sim/sim_mig.c), through the plugin's own NVML code
(dra_driver/mig.py): NVIDIA's H100 80GB and A100 80GB profiles and placements, instances made and
destroyed with NVML's error codes, and what a process inside a MIG device sees. Each case runs in
a child process: a process maps one simulated state file for its life."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from dra_driver.hookpath import native_paths
from tests.support.hook import kv
from tests.support.nvml import needs_sim, sim_nvml_env

pytestmark = needs_sim
GiB = 1 << 30
MiB = 1 << 20


def nvml_child(tmp_path: Path, code: str, mig: str = "0", product: str | None = None, devices: int = 1) -> dict:
    """Run `code` with pynvml on the simulated NVML and dra_driver.mig imported; it sets `out`."""
    env = sim_nvml_env(tmp_path / "sim.state", devices, 80 * GiB) | {"GPUSHARE_SIM_MIG": mig}
    if product:
        env["GPUSHARE_SIM_MIG_PRODUCT"] = product
    script = textwrap.dedent("""
        import json, pynvml
        from dra_driver.discovery import load_nvml
        from dra_driver.mig import MigError, MigInstances, read_profiles
        load_nvml(SIM_DIR)
        pynvml.nvmlInit()
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(gpu)
        out = {}
    """).replace("SIM_DIR", repr(str(Path(native_paths()["sim_nvml"]).parent))) + textwrap.dedent(code) + \
        "\nprint(json.dumps(out))\n"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_h100_profiles_and_placements_are_nvidias(tmp_path):
    out = nvml_child(tmp_path, """
        out["profiles"] = {p.name: [p.profile_id, p.compute_slices, p.memory_bytes >> 20, p.multiprocessors,
                                    p.copy_engines, p.decoders, p.jpeg_engines, p.ofa_engines, list(p.placements),
                                    p.size]
                           for p in read_profiles(pynvml, gpu)}
    """)
    assert out["profiles"] == {
        "1g.10gb": [19, 1, 9984, 16, 1, 1, 1, 0, [0, 1, 2, 3, 4, 5, 6], 1],
        "2g.20gb": [14, 2, 20096, 32, 2, 2, 2, 0, [0, 2, 4], 2],
        "3g.40gb": [9, 3, 40448, 60, 3, 3, 3, 0, [0, 4], 4],
        "4g.40gb": [5, 4, 40448, 64, 4, 4, 4, 0, [0], 4],
        "7g.80gb": [0, 7, 81152, 132, 8, 7, 7, 1, [0], 8],
        "1g.10gb+me": [20, 1, 9984, 16, 1, 1, 1, 1, [0, 1, 2, 3, 4, 5, 6], 1],
        "1g.20gb": [15, 1, 20096, 26, 1, 1, 1, 0, [0, 2, 4, 6], 2],
    }


def test_a100_profiles_and_mig_off(tmp_path):
    out = nvml_child(tmp_path, """
        out["a100"] = {p.name: [p.multiprocessors, p.memory_bytes >> 20] for p in read_profiles(pynvml, gpu)}
        out["off"] = read_profiles(pynvml, pynvml.nvmlDeviceGetHandleByIndex(1))
        try:
            pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(pynvml.nvmlDeviceGetHandleByIndex(1), 9)
        except pynvml.NVMLError as e:
            out["off_error"] = e.value
    """, product="A100-80GB", devices=2)
    assert out["a100"]["3g.40gb"] == [42, 40192] and out["a100"]["7g.80gb"] == [98, 80896]
    assert out["a100"]["1g.10gb"] == [14, 9728] and len(out["a100"]) == 7
    assert out["off"] is None  # MIG mode off: no profiles, the GPU is offered as before
    assert out["off_error"] == 3  # NVML_ERROR_NOT_SUPPORTED


def test_the_operator_switches_mig_mode_on_an_idle_gpu_only(tmp_path):
    out = nvml_child(tmp_path, """
        other = pynvml.nvmlDeviceGetHandleByIndex(1)
        out["before"] = pynvml.nvmlDeviceGetMigMode(other)
        pynvml.nvmlDeviceSetMigMode(other, 1)  # what nvidia-smi -i 1 -mig 1 calls
        out["after"] = [p.name for p in read_profiles(pynvml, other)][:1]
        p = {p.name: p for p in read_profiles(pynvml, gpu)}["1g.10gb"]
        MigInstances(pynvml).create(uuid, p, 0)
        try:
            pynvml.nvmlDeviceSetMigMode(gpu, 0)
        except pynvml.NVMLError as e:
            out["busy"] = e.value
    """, devices=2)
    assert out["before"] == [0, 0] and out["after"] == ["1g.10gb"]
    assert out["busy"] == 19  # NVML_ERROR_IN_USE: it has an instance


def test_instances_made_listed_and_destroyed_with_nvml_codes(tmp_path):
    out = nvml_child(tmp_path, """
        profiles = {p.name: p for p in read_profiles(pynvml, gpu)}
        mig = MigInstances(pynvml)
        a = mig.create(uuid, profiles["3g.40gb"], 0)
        b = mig.create(uuid, profiles["3g.40gb"], 4)
        out["a"], out["b"] = [a.gi_id, a.start, a.uuid], [b.gi_id, b.start, b.uuid]
        for name, start in (("1g.10gb", 3), ("3g.40gb", 4)):
            try:
                mig.create(uuid, profiles[name], start)
            except MigError as e:
                out.setdefault("full", []).append(e.code)
        try:
            mig.create(uuid, profiles["3g.40gb"], 2)
        except MigError as e:
            out["bad_placement"] = e.code
        out["listed"] = sorted(i.uuid for i in mig.list(uuid, tuple(profiles.values())))
        handle = pynvml.nvmlDeviceGetHandleByUUID(a.uuid)
        out["mig_memory"] = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        gi = pynvml.nvmlDeviceGetGpuInstanceById(gpu, a.gi_id)
        try:
            pynvml.nvmlGpuInstanceDestroy(gi)
        except pynvml.NVMLError as e:
            out["gi_in_use"] = e.value
        out["destroyed"] = [mig.destroy(uuid, a.gi_id), mig.destroy(uuid, a.gi_id)]
        c = mig.create(uuid, profiles["1g.10gb"], 0)
        out["c"] = [c.start, c.uuid != a.uuid]
        out["after"] = sorted(i.uuid for i in mig.list(uuid, tuple(profiles.values())))
    """)
    assert out["a"][1:2] == [0] and out["b"][1:2] == [4] and out["a"][2].startswith("MIG-")
    assert out["full"] == [23, 23]  # NVML_ERROR_INSUFFICIENT_RESOURCES: overlaps
    assert out["bad_placement"] == 2  # not a placement of the profile: NVML_ERROR_INVALID_ARGUMENT
    assert out["listed"] == sorted([out["a"][2], out["b"][2]])
    assert out["mig_memory"] == 40448 * MiB
    assert out["gi_in_use"] == 19  # NVML_ERROR_IN_USE: its compute instance is still there
    assert out["destroyed"] == [True, False]
    assert out["c"] == [0, True]  # a new instance gets a new UUID
    assert len(out["after"]) == 2 and out["a"][2] not in out["after"]


def test_a_process_in_a_mig_device_sees_its_memory_and_multiprocessors(tmp_path):
    made = nvml_child(tmp_path, """
        p = {p.name: p for p in read_profiles(pynvml, gpu)}["1g.10gb"]
        out["uuid"] = MigInstances(pynvml).create(uuid, p, 2).uuid
    """)
    env = sim_nvml_env(tmp_path / "sim.state", 1, 80 * GiB) | {
        "GPUSHARE_SIM_MIG": "0", "CUDA_VISIBLE_DEVICES": made["uuid"],
        "LD_LIBRARY_PATH": str(Path(native_paths()["sim_cuda"]).parent)}
    probe = native_paths()["probe"]
    info = kv(subprocess.run([probe, "meminfo"], env=env, capture_output=True, text=True, timeout=30,
                             check=True).stdout)
    assert int(info["cu_total"]) == 9984 * MiB and int(info["device_total"]) == 9984 * MiB
    over = subprocess.run([probe, "alloc", "--chunk", "1Gi", "--max", "12Gi"], env=env, capture_output=True,
                          text=True, timeout=30)
    assert "allocated=9" in over.stdout, over.stdout + over.stderr  # 9 GiB of the instance's 9.75, not 80


def test_nvml_lists_an_instances_processes_on_its_mig_device_and_has_no_utilization_in_mig_mode(tmp_path):
    """As NVML's reference says (hook/sim/sim_nvml.c cites it): a MIG device's handle lists its own
    instance's processes with their memory; the parent's lists them all with their GPU and compute
    instance IDs; utilization, the GPU's and per process, is NOT_SUPPORTED on a GPU in MIG mode and
    on its MIG devices, and still answered on a GPU out of MIG mode."""
    made = nvml_child(tmp_path, """
        p = {p.name: p for p in read_profiles(pynvml, gpu)}["1g.10gb"]
        out["uuids"] = [MigInstances(pynvml).create(uuid, p, s).uuid for s in (0, 1)]
    """, devices=2)
    probe = native_paths()["probe"]
    holders = []
    try:
        for uuid, size in zip(made["uuids"], ("256Mi", "512Mi"), strict=True):
            env = sim_nvml_env(tmp_path / "sim.state", 2, 80 * GiB) | {
                "CUDA_VISIBLE_DEVICES": uuid, "LD_LIBRARY_PATH": str(Path(native_paths()["sim_cuda"]).parent)}
            h = subprocess.Popen([probe, "alloc", "--chunk", size, "--max", size, "--hold", "30"], env=env,
                                 stdout=subprocess.PIPE, text=True)
            holders.append(h)
            assert h.stdout is not None and "allocated=" in h.stdout.readline()
        out = nvml_child(tmp_path, """
            def listed(h):
                return sorted([p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId]
                              for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
            def refused(fn, *args):
                try:
                    fn(*args)
                except pynvml.NVMLError as e:
                    return e.value
                return 0
            migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i) for i in range(2)]
            out["mig"] = {pynvml.nvmlDeviceGetUUID(m): listed(m) for m in migs}
            out["gi"] = {pynvml.nvmlDeviceGetUUID(m): pynvml.nvmlDeviceGetGpuInstanceId(m) for m in migs}
            out["parent"] = listed(gpu)
            out["refused"] = [refused(pynvml.nvmlDeviceGetUtilizationRates, h) for h in (gpu, *migs)] + [
                refused(pynvml.nvmlDeviceGetProcessUtilization, h, 0) for h in (gpu, *migs)]
            other = pynvml.nvmlDeviceGetHandleByIndex(1)  # not in MIG mode
            out["other"] = [refused(pynvml.nvmlDeviceGetUtilizationRates, other)]
        """)
    finally:
        for h in holders:
            h.kill()
            h.wait()
    a, b = made["uuids"]
    pa, pb = (h.pid for h in holders)
    ga, gb = out["gi"][a], out["gi"][b]
    assert out["mig"] == {a: [[pa, 256 * MiB, ga, 0]], b: [[pb, 512 * MiB, gb, 0]]}  # each its own only
    assert out["parent"] == sorted([[pa, 256 * MiB, ga, 0], [pb, 512 * MiB, gb, 0]])  # the aggregate
    assert out["refused"] == [3] * 6  # NVML_ERROR_NOT_SUPPORTED
    assert out["other"] == [0]
