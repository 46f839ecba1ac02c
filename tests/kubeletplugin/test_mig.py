"""MIG devices prepared and unprepared by the kubelet plugin (a subprocess, as the DaemonSet runs
it) on a simulated H100 in MIG mode (docs/mig.md): Prepare makes the allocated placement's
instance through the simulated NVML and the CDI spec names just that MIG device; Unprepare
destroys it; a crash between making the instance and writing the spec leaves no instance after
recovery; an instance someone else made is used as it is and never destroyed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from dra_driver.hookpath import native_paths
from playground.claims import make_claim, result
from playground.kubelet import Kubelet
from tests.support.nvml import needs_sim
from tests.support.plugin import PluginProcess

pytestmark = needs_sim
REPO = Path(__file__).parents[2]


@pytest.fixture
def sim_hook_dir(tmp_path):
    """A hook folder as install-hook --with-sim writes it: the library and the simulated driver."""
    native = native_paths()
    hook = tmp_path / "hook"
    (hook / "sim").mkdir(parents=True)
    shutil.copy(native["library"], hook)
    shutil.copy(native["sim_cuda"], hook / "sim" / "libcuda.so.1")
    shutil.copy(native["sim_nvml"], hook / "sim" / "libnvidia-ml.so.1")
    return str(hook)


@pytest.fixture
def mig_plugin(dirs, sim_hook_dir, shared_emulator, tmp_path):
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(yaml.safe_dump({"gpus": [{"memory": "80Gi", "migMode": True}, {"memory": "80Gi"}]}))
    kubeconfig = shared_emulator.write_kubeconfig(str(tmp_path / "kubeconfig"))
    p = PluginProcess(dirs, sim_hook_dir, kubeconfig, extra=("--mock-gpus", str(gpus), "--mig-gpus", "0"))
    yield p
    p.kill()


def instances(dirs) -> list[dict]:
    """The simulated GPU 0's MIG instances, as NVML lists them to another process."""
    script = textwrap.dedent("""
        import json, pynvml
        from dra_driver.discovery import load_nvml
        from dra_driver.mig import MigInstances, read_profiles
        load_nvml(SIM_DIR)
        pynvml.nvmlInit()
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        found = MigInstances(pynvml).list(pynvml.nvmlDeviceGetUUID(gpu), read_profiles(pynvml, gpu))
        print(json.dumps([{"start": i.start, "profile": i.profile_id, "uuid": i.uuid, "gi": i.gi_id} for i in found]))
    """).replace("SIM_DIR", repr(str(Path(native_paths()["sim_nvml"]).parent)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")} | {
        "GPUSHARE_SIM_STATE": os.path.join(dirs.state, "sim.state")}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


def make_instance(dirs, profile: str, start: int) -> str:
    """An instance made by someone else (an operator's static layout): its MIG UUID."""
    script = textwrap.dedent(f"""
        import pynvml
        from dra_driver.discovery import load_nvml
        from dra_driver.mig import MigInstances, read_profiles
        load_nvml({str(Path(native_paths()["sim_nvml"]).parent)!r})
        pynvml.nvmlInit()
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        p = {{p.name: p for p in read_profiles(pynvml, gpu)}}[{profile!r}]
        print(MigInstances(pynvml).create(pynvml.nvmlDeviceGetUUID(gpu), p, {start}).uuid)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")} | {
        "GPUSHARE_SIM_STATE": os.path.join(dirs.state, "sim.state")}
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()


def spec_env(dirs, uid) -> dict[str, str]:
    spec = json.loads(Path(dirs.cdi, f"k8s.gpushare.dev-claim_{uid}.json").read_text())
    return dict(e.split("=", 1) for e in spec["containerEdits"]["env"])


def test_prepare_makes_the_instance_and_unprepare_destroys_it(api, dirs, mig_plugin):
    mig_plugin.start()
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    a = make_claim(api, [result("gpu-0-mig-3g-40gb-4")])
    b = make_claim(api, [result("gpu-0-mig-1g-10gb-0")])
    for c in (a, b):
        assert kubelet.prepare(c).claims[c.uid].error == ""
    made = {i["start"]: i for i in instances(dirs)}
    assert sorted(made) == [0, 4] and made[4]["profile"] == 9 and made[0]["profile"] == 19
    env = spec_env(dirs, a.uid)
    assert env["CUDA_VISIBLE_DEVICES"] == made[4]["uuid"]  # just that instance
    assert env["GPUSHARE_DEVICE_UUID_0"] == made[4]["uuid"]
    assert env["GPUSHARE_MEMORY_LIMIT_0"] == str(40448 << 20)  # the instance's memory
    # a placement overlapping an instance: the scheduler never allocates it (counters); Prepare refuses it
    c = make_claim(api, [result("gpu-0-mig-4g-40gb-0")])
    assert f"overlaps MIG device {made[0]['uuid']}, of claim(s) {b.uid}" in kubelet.prepare(c).claims[c.uid].error
    assert kubelet.unprepare(a).claims[a.uid].error == ""
    assert [i["start"] for i in instances(dirs)] == [0]
    # a restart keeps the prepared claim's instance (adopted from the ledger)
    assert mig_plugin.terminate() == 0
    mig_plugin.start()
    kubelet.close()
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    assert [i["uuid"] for i in instances(dirs)] == [made[0]["uuid"]]
    assert kubelet.unprepare(b).claims[b.uid].error == ""
    assert instances(dirs) == []
    kubelet.close()


@pytest.mark.parametrize("step", ["prepare-mig-recorded", "prepare-mig-created", "prepare-files-written"])
def test_a_crash_between_making_the_instance_and_the_spec_leaves_no_instance(api, dirs, mig_plugin, step):
    claim = make_claim(api, [result("gpu-0-mig-2g-20gb-2")])
    mig_plugin.start(fault=step)
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    with pytest.raises(Exception):  # noqa: B017  (the plugin dies mid-call: the call fails, however gRPC says it)
        kubelet.prepare(claim)
    mig_plugin.wait_killed()
    kubelet.close()
    if step != "prepare-mig-recorded":
        assert [i["start"] for i in instances(dirs)] == [2]  # the crash left it
    mig_plugin.start()
    assert instances(dirs) == []  # recovery destroyed it, before any retry
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    assert kubelet.prepare(claim).claims[claim.uid].error == ""  # the kubelet's retry
    assert [i["start"] for i in instances(dirs)] == [2]
    assert kubelet.unprepare(claim).claims[claim.uid].error == ""
    assert instances(dirs) == []
    kubelet.close()
    assert mig_plugin.terminate() == 0


def test_an_instance_someone_else_made_is_used_and_never_destroyed(api, dirs, mig_plugin):
    mig_plugin.start()
    theirs = make_instance(dirs, "3g.40gb", 0)
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    claim = make_claim(api, [result("gpu-0-mig-3g-40gb-0")])
    assert kubelet.prepare(claim).claims[claim.uid].error == ""
    assert spec_env(dirs, claim.uid)["CUDA_VISIBLE_DEVICES"] == theirs
    assert kubelet.unprepare(claim).claims[claim.uid].error == ""
    assert [i["uuid"] for i in instances(dirs)] == [theirs]  # still there
    # one that overlaps the allocated placement fails Prepare and is left alone
    other = make_claim(api, [result("gpu-0-mig-1g-10gb-2")])
    error = kubelet.prepare(other).claims[other.uid].error
    assert "overlaps MIG device " + theirs in error and "did not make" in error
    assert [i["uuid"] for i in instances(dirs)] == [theirs]
    kubelet.close()
