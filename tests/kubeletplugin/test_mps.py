"""MPS (docs/strategies.md): the plugin runs one control daemon per GPU for the GPU's MPS claims
and sets the server limits through its stdin protocol; here the daemon is the playground's
stand-in (playground/mpscontrol.py), which records every command."""

from __future__ import annotations

import os
import sys

import pytest

from kubeletplugin.prepared import PreparedGpu
from kubeletplugin.strategies.mps import layout as mpslayout
from kubeletplugin.strategies.mps.control import MpsControl, MpsError
from playground.claims import gpushare_config, make_claim, opaque_config, result
from playground.mpscontrol import effective_share
from tests.support import GiB
from tests.support.cdi import env_of, load_spec

STAND_IN = [sys.executable, "-m", "playground.mpscontrol"]
UUID = "GPU-5ea1c0de-0000-4000-8000-000000000000"


@pytest.fixture
def mps(tmp_path):
    control = MpsControl(str(tmp_path), STAND_IN)
    yield control
    control.stop(UUID)


def gpu(compute: int, memory: int = 4 * GiB) -> PreparedGpu:
    return PreparedGpu(0, UUID, 0, memory, compute)


def test_one_daemon_per_gpu_takes_the_limits_and_stops_with_the_last_claim(mps, tmp_path):
    mps.apply(UUID, [gpu(30), gpu(30)])
    assert mps.command(UUID, "get_default_active_thread_percentage") == ["30.0"]
    mps.ensure(UUID)  # found again (a plugin restart): not a second daemon
    mps.command(UUID, "start_server -uid 0")
    (server,) = mps.command(UUID, mpslayout.GET_SERVERS)
    mps.apply(UUID, [gpu(30), gpu(50, 6 * GiB)])  # a running server gets the new ceiling too
    assert mps.command(UUID, f"get_active_thread_percentage {server}") == ["50.0"]
    assert mps.command(UUID, f"get_device_pinned_mem_limit {server} 0") == ["6144M"]
    with open(os.path.join(mpslayout.log_dir(str(tmp_path), UUID), "control.log")) as f:
        log = f.read()
    assert log.count("Starting control daemon using socket") == 1
    assert log.count("Stand-in control daemon (gpushare-dra playground) for CUDA_VISIBLE_DEVICES=" + UUID) == 1
    assert "set_default_active_thread_percentage 30" in log and f"set_active_thread_percentage {server} 50" in log
    mps.apply(UUID, [])
    assert not mps.running(UUID) and not os.path.exists(mpslayout.gpu_dir(str(tmp_path), UUID))


def test_a_refused_command_is_an_error_naming_it(mps):
    mps.ensure(UUID)
    assert mps.command(UUID, "set_default_active_thread_percentage 300") == ["Error: bad arguments to "
                                                                             "set_default_active_thread_percentage"]
    with pytest.raises(MpsError, match="MPS control of GPU"):
        MpsControl("/nonexistent", ["/nonexistent/nvidia-cuda-mps-control"]).command(UUID, "get_server_list")


def test_a_missing_control_program_is_one_error_naming_the_flag(tmp_path):
    """The deployed plugin's image has no nvidia-cuda-mps-control (docs/strategies.md, "On GPU nodes")."""
    with pytest.raises(MpsError, match=r"--mps-control 'no-such-mps-control' not found .*On GPU nodes"):
        MpsControl(str(tmp_path), ["no-such-mps-control"]).ensure(UUID)  # on a GPU host the real one may be there


def test_tenant_env_edits_cannot_raise_its_share(api, kubelet, dirs):
    """Two MPS claims of 25 % on one GPU (partition mode: equal shares): the server's ceiling the
    plugin set is 25 %; whatever the tenant does to its environment, MPS gives it no more."""
    claims = []
    for share in ("gpu-0-share-0", "gpu-0-share-1"):
        claim = make_claim(api, [result(share)], config=[opaque_config(gpushare_config(sharingStrategy="MPS"))])
        assert kubelet.prepare(claim).claims[claim.uid].error == ""
        claims.append(claim)
    tenant = env_of(load_spec(dirs, claims[0].uid))
    uuid = tenant["GPUSHARE_DEVICE_UUID_0"]
    control = MpsControl(dirs.state, STAND_IN)
    try:
        control.command(uuid, "start_server -uid 0")  # the first client's connection starts the server
        (server,) = control.command(uuid, mpslayout.GET_SERVERS)
        (ceiling,) = control.command(uuid, f"get_active_thread_percentage {server}")
        assert float(ceiling) == int(tenant[mpslayout.THREAD_ENV]) == 25
        for edited in ({}, {mpslayout.THREAD_ENV: "100"}, {mpslayout.THREAD_ENV: "garbage"},
                       {**tenant, mpslayout.THREAD_ENV: "99", mpslayout.PINNED_ENV: "0=80G"}):
            assert effective_share(int(float(ceiling)), edited) <= 25
        assert effective_share(25, {mpslayout.THREAD_ENV: "10"}) == 10  # lowering is the tenant's to do
        # the memory budget is the library's (limits file, read-only) and the server's pinned limit
        assert control.command(uuid, f"get_device_pinned_mem_limit {server} 0") == ["4096M"]
    finally:
        for claim in claims:
            kubelet.unprepare(claim)
    assert not control.running(uuid)  # the last MPS claim of the GPU took its daemon along
