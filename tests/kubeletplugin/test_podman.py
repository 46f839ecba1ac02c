"""A real CDI consumer: podman + runc run a container with each CDI device ID we return.

Needs root and podman (CI installs podman, runc and busybox-static). podman 4.3 reads CDI
specs only from /etc/cdi and /var/run/cdi; each test's plugin writes to its own CDI folder,
which podman sees as /var/run/cdi in a private mount namespace (cdiroot.py), so nothing here
touches the host's /var/run/cdi.
"""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from dra_driver.discovery import sim_uuid
from dra_driver.hookpath import native_paths
from kubeletplugin.agent.agent import Agent
from playground.claims import make_claim, result
from playground.containers import PodmanRunner
from playground.kubelet import Kubelet
from tests.support import GiB
from tests.support.cdi import duplicate_devices, load_spec, podman_run, spec_path

pytestmark = pytest.mark.podman

PODMAN = shutil.which("podman")
LIBRARY = "/usr/local/gpushare/lib/libgpushare.so"

if os.geteuid() != 0:
    pytest.skip("podman CDI test needs root (it runs containers with bind mounts)", allow_module_level=True)
if PODMAN is None:
    pytest.skip("podman not installed (apt-get install -y podman runc busybox-static)", allow_module_level=True)

@pytest.fixture(scope="module")
def podman_env():
    """podman + runc set up as playground.containers does it, on a busybox root filesystem."""
    why_not = PodmanRunner.available()
    if why_not:
        pytest.skip(f"podman runner unavailable: {why_not}")
    if shutil.which("busybox") is None:
        pytest.fail("busybox not installed (apt-get install -y busybox-static): the container's rootfs needs it")
    runner = PodmanRunner()
    yield runner
    runner.close()


def run_in_container(runner: PodmanRunner, cdi_root: str, device_ids: list[str], script: str) -> str:
    proc = podman_run(runner, cdi_root, device_ids, ["/bin/sh", "-c", script])
    assert proc.returncode == 0, f"{proc.args}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc.stdout


SCRIPT = f"""
env | grep '^GPUSHARE_\\|^LD_PRELOAD' | sort
echo ---limits; cat /var/run/gpushare/limits
echo ---preload; cat /etc/ld.so.preload
echo ---region; stat -c %s /var/run/gpushare/region/0 /var/run/gpushare/control/0
echo ---library; stat -c %s {LIBRARY}
"""


@pytest.mark.parametrize("mode", ["capacity", "partition"])
def test_podman_runs_container_with_our_cdi_devices(api, start_plugin, dirs, podman_env, hook_dir, mode):
    start_plugin()
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    if mode == "capacity":
        claim = make_claim(api, [result("gpu-1", share_id=str(uuid.uuid4()),
                                        consumed={"memory": "3Gi", "compute": "40"})])
        memory, compute = 3 * GiB, 40
    else:
        claim = make_claim(api, [result("gpu-1-share-2")])
        memory, compute = 4 * GiB, 25
    uid = claim.uid
    try:
        answer = kubelet.prepare(claim).claims[uid]
        assert answer.error == ""
        load_spec(dirs, uid)  # schema-valid
        for device in answer.devices:
            out = run_in_container(podman_env, dirs.cdi, list(device.cdi_device_ids), SCRIPT)
            env, _, rest = out.partition("---limits\n")
            limits, _, rest = rest.partition("---preload\n")
            preload, _, rest = rest.partition("---region\n")
            region, _, library = rest.partition("---library\n")
            assert f"GPUSHARE_MEMORY_LIMIT_0={memory}\n" in env
            assert f"GPUSHARE_COMPUTE_LIMIT_0={compute}\n" in env
            assert f"GPUSHARE_DEVICE_UUID_0={sim_uuid(1)}\n" in env
            assert f"GPUSHARE_CLAIM_UID={uid}\n" in env
            assert f"LD_PRELOAD={LIBRARY}\n" in env
            assert f"GPUSHARE_MEMORY_LIMIT_0={memory}\n" in limits and f"GPUSHARE_CLAIM_UID={uid}\n" in limits
            assert preload.strip() == LIBRARY
            assert region.split() == [str(1 << 20), "4096"]
            assert library.strip() == str(os.path.getsize(os.path.join(hook_dir, "libgpushare.so")))
        # The container cannot change its limits: the file is mounted read-only.
        out = run_in_container(podman_env, dirs.cdi, list(answer.devices[0].cdi_device_ids),
                               "echo GPUSHARE_MEMORY_LIMIT_0=1 >> /var/run/gpushare/limits"
                               " && echo writable || echo refused")
        assert out.strip().endswith("refused")
        # Nor the agent's rate: the control file is mounted read-only too (root in the container).
        out = run_in_container(podman_env, dirs.cdi, list(answer.devices[0].cdi_device_ids),
                               "echo x > /var/run/gpushare/control/0 && echo writable || echo refused")
        assert out.strip().endswith("refused")
    finally:
        assert kubelet.unprepare(claim).claims[uid].error == ""
        kubelet.close()
    assert not os.path.exists(spec_path(dirs, uid))


def test_non_root_container_shares_its_region_through_the_mount(api, start_plugin, dirs, podman_env, monkeypatch):
    """Claim folders are 0700, yet a container running as UID 1000 maps its region through
    the bind mount: two processes of the claim share one 1Gi budget (real library, simulated
    driver); limits stay read-only for it. (`podman_env`: the same skip rules; this test needs a
    rootfs with the probe, so it builds its own runner.)"""
    native = native_paths()
    # No sampling in this process: the simulated NVML, once loaded, stays bound to the first
    # node's state file for the life of the process, and the agent's tests need their own.
    monkeypatch.setattr(Agent, "_open_nvml", lambda self: None)
    start_plugin(hook_dir=os.path.dirname(native["library"]))
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    claim = make_claim(api, [result("gpu-0", share_id=str(uuid.uuid4()), consumed={"memory": "1Gi", "compute": "50"})])
    answer = kubelet.prepare(claim).claims[claim.uid]
    assert answer.error == ""
    assert os.stat(os.path.join(dirs.state, "claims", claim.uid)).st_mode & 0o777 == 0o700
    runner = PodmanRunner(native["probe"], (native["library"], native["sim_cuda"], native["sim_nvml"]))
    script = """
grep ^Uid /proc/self/status
P="/usr/local/bin/gpushare-probe alloc --chunk 256Mi"
$P --max 768Mi --hold 5 | while read line; do
  echo "first: $line"
  case "$line" in allocated=*) $P --max 2Gi | while read l; do echo "second: $l"; done;; esac
done
echo x >> /var/run/gpushare/limits && echo limits-writable || echo limits-refused
"""
    try:
        proc = podman_run(runner, dirs.cdi, list(answer.devices[0].cdi_device_ids), ["/bin/sh", "-c", script],
                          options=("--user", "1000:1000"))
    finally:
        runner.close()
        kubelet.unprepare(claim)
        kubelet.close()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Uid:\t1000" in out, out
    assert "first: allocated=805306368 chunks=3 result=max" in out, out
    assert "second: allocated=268435456 chunks=1 result=oom" in out, out  # 1Gi - 768Mi held by the first
    assert out.strip().endswith("limits-refused")


def test_podman_refuses_a_device_defined_twice_and_ignores_our_temporaries(api, start_plugin, dirs, podman_env):
    """Why temporaries must not end in .json: a complete one left by a kill defines the
    claim's device a second time and podman refuses the container (the issue: exit 126)."""
    start_plugin()
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    claim = make_claim(api, [result("gpu-3-share-1")])
    answer = kubelet.prepare(claim).claims[claim.uid]
    devices = list(answer.devices[0].cdi_device_ids)
    spec = spec_path(dirs, claim.uid)
    name = os.path.basename(spec)
    try:
        shutil.copy(spec, os.path.join(dirs.cdi, f".{name}.a1b2c3d4.tmp"))  # what a kill leaves now
        assert duplicate_devices(dirs.cdi) == []
        assert podman_run(podman_env, dirs.cdi, devices, ["/bin/sh", "-c", "true"]).returncode == 0
        shutil.copy(spec, os.path.join(dirs.cdi, f".tmp-a1b2c3d4-{name}"))  # what it left before
        assert duplicate_devices(dirs.cdi) == [f"k8s.gpushare.dev/claim={claim.uid}-gpu-3-share-1"]
        proc = podman_run(podman_env, dirs.cdi, devices, ["/bin/sh", "-c", "true"])
        assert proc.returncode != 0 and "unresolvable CDI devices" in proc.stderr, proc.stderr
    finally:
        kubelet.unprepare(claim)
        kubelet.close()
