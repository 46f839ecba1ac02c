"""MPS on a GPU node laid out as a driver root (issue 27; docs/strategies.md, "On GPU nodes"):
no --mps-control flag; the plugin finds nvidia-cuda-mps-control in --driver-root's bin and runs
it chrooted there (kubeletplugin/strategies/mps/root.py), in a mount namespace of its own with the GPU's
folders and its own /dev/shm bound in. The driver root here is an overlay of this machine's
root (its userland, as a real driver root has the host's) with the simulated driver's files
under usr/lib/x86_64-linux-gnu and, at usr/bin/nvidia-cuda-mps-control, the stand-in daemon
(playground/mpscontrol.py): what NVIDIA's daemon would be. An MPS claim's pod then runs as a
client of that daemon's server and is held to its share."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from dra_driver.discovery import MockBackend
from dra_driver.hookpath import native_paths
from kubeletplugin.strategies.mps import layout as mpslayout
from kubeletplugin.strategies.mps.control import SHM_SIZE
from playground.claims import gpushare_config, opaque_config
from tests.support import BUILD, CPU_TIMED, REPO
from tests.support.hook import throughput
from tests.support.tenant import run_tenant

MPS = [opaque_config(gpushare_config(sharingStrategy="MPS"))]
KERNEL_US = 200
LAUNCH = ["launch", "--seconds", "2", "--kernel-us", str(KERNEL_US), "--grid", "132"]


def _overlay_why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (an overlay mount, the daemon's mount namespace)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "no overlay filesystem in this kernel"
    return None


@pytest.fixture
def driver_root(tmp_path):
    """An overlay of / with the simulated driver's files and the stand-in as NVIDIA's program."""
    why = _overlay_why_not()
    if why:
        pytest.skip(why)
    upper, work, root = tmp_path / "upper", tmp_path / "work", tmp_path / "driver-root"
    lib = upper / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    for name, key in (("libcuda.so.1", "sim_cuda"), ("libnvidia-ml.so.1", "sim_nvml")):
        shutil.copy(native_paths()[key], lib / name)
    # The stand-in and the system python, inside the root: the daemon's /tmp is a tmpfs of its own
    # (kubeletplugin/strategies/mps/root.py), which hides a checkout (and its venv) under /tmp. The stand-in
    # needs the standard library only (-S: no site-packages).
    stand_in = upper / "opt/gpushare-test"
    for package in ("playground", "kubeletplugin"):
        shutil.copytree(REPO / package, stand_in / package, ignore=shutil.ignore_patterns("__pycache__"))
    program = upper / "usr/bin/nvidia-cuda-mps-control"
    program.parent.mkdir(parents=True, exist_ok=True)
    program.write_text("#!/bin/sh\ncd /opt/gpushare-test && exec python3 -S -m playground.mpscontrol \"$@\"\n")
    program.chmod(0o755)
    work.mkdir()
    root.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir=/,upperdir={upper},workdir={work}",
                    str(root)], check=True)
    yield root
    subprocess.run(["umount", "-l", str(root)], check=False)


@CPU_TIMED
def test_an_mps_claims_pod_runs_on_the_driver_roots_daemon_and_is_held_to_its_share(node_factory, driver_root):
    node = node_factory(backend=MockBackend("1x16Gi"), driver_root=str(driver_root), mps_control=(
        "nvidia-cuda-mps-control",), mps_gpus="all", mixed_strategies=False)  # --mps-control left at its default
    assert node.plugin.driver.mps.root == str(driver_root)
    ref, ids = node.claim(memory="1Gi", compute=25, config=MPS)
    try:
        uuid = node.plugin.driver.prepared_claims()[ref.uid].gpus[0].uuid
        pid = node.plugin.driver.mps.daemon_pid(uuid)
        assert pid is not None
        assert os.readlink(f"/proc/{pid}/root") == str(driver_root)  # chrooted into the driver root
        assert os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino  # its own mounts
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        assert env[b"CUDA_MPS_PIPE_DIRECTORY"] == b"/tmp/gpushare-mps/pipe"
        log = Path(mpslayout.control_log(node.dirs.state, uuid)).read_text()  # its log, where the agent reads
        assert "Starting control daemon using socket /tmp/gpushare-mps/pipe/control" in log
        assert "set_default_active_thread_percentage 25" in log  # the plugin's commands reached it
        spec_mounts = {m["containerPath"]: m for m in _spec(node, ref.uid)["containerEdits"]["mounts"]}
        assert spec_mounts["/dev/shm"]["hostPath"] == mpslayout.shm_dir(node.dirs.state, uuid)
        assert "ro" in spec_mounts[mpslayout.CONTAINER_PIPE_DIR]["options"]
        w = node.runner.start_command("tenant", ids, [str(BUILD / "gpushare-probe"), *LAUNCH])
        node.workloads.append(w)
        out = w.read_until("launches=", timeout=60)
        got = throughput(out, KERNEL_US)
        print(f"an MPS claim of 25 % on the driver root's daemon: {got:.3f} of the GPU, "
              f"a {KERNEL_US} us whole-GPU kernel took {float(out['kernel_us']):.0f} us")
        assert float(out["kernel_us"]) >= 3 * KERNEL_US  # an MPS client on the server's 25 % of the SMs
        assert got <= 0.29
    finally:
        for w in node.workloads:
            w.stop()
        assert node.kubelet.unprepare(ref).claims[ref.uid].error == ""
    assert node.plugin.driver.mps.daemon_pid(uuid) is None  # the GPU's last MPS claim took its daemon along


def _spec(node, uid: str) -> dict:
    import json

    (path,) = Path(node.dirs.cdi).glob(f"*{uid}*.json")
    return json.loads(path.read_text())


def test_an_mps_tenant_fills_the_gpus_dev_shm_only_up_to_its_tmpfs(node_factory, driver_root, tmp_path):
    """The GPU's /dev/shm is read-write in its MPS claims' containers: a tenant writing 2 x
    SHM_SIZE there stops at SHM_SIZE (ENOSPC), in memory, not on the state disk; the GPU's last
    claim unprepared takes the mount away with its folder."""
    node = node_factory(backend=MockBackend("1x16Gi"), driver_root=str(driver_root), mps_control=(
        "nvidia-cuda-mps-control",), mps_gpus="all", mixed_strategies=False)
    ref, ids = node.claim(memory="1Gi", compute=25, config=MPS)
    uuid = node.plugin.driver.prepared_claims()[ref.uid].gpus[0].uuid
    shm = mpslayout.shm_dir(node.dirs.state, uuid)
    try:
        out = run_tenant(node.dirs.cdi, ids, str(tmp_path / "view"), textwrap.dedent(f"""
            import errno, os
            written = 0
            with open(os.environ["VIEW"] + "/dev/shm/fill", "wb", buffering=0) as f:
                try:
                    while written < {2 * SHM_SIZE}:
                        written += f.write(bytes(1 << 20))
                except OSError as e:
                    print("error", errno.errorcode[e.errno])
            print("written", written)
        """), timeout=60)
        print(out)
        assert "error ENOSPC" in out, out
        assert int(out.split("written ")[1].split()[0]) <= SHM_SIZE
        assert os.path.ismount(shm) and os.statvfs(shm).f_blocks * os.statvfs(shm).f_frsize == SHM_SIZE
        assert stat.S_IMODE(os.stat(shm).st_mode) == 0o1777
    finally:
        assert node.kubelet.unprepare(ref).claims[ref.uid].error == ""
    assert not os.path.lexists(shm)
    with open("/proc/self/mountinfo") as f:
        assert shm not in f.read()
