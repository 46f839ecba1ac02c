"""An MPS client of the simulated driver sees its share of the SMs as
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, as a real MPS client does (NVIDIA/k8s-device-plugin#679:
deviceQuery under MPS reports the limited SMs): its server's active-thread percentage of the
GPU's 132, rounded up to whole TPCs of 2 SMs as the driver rounds an SM limit (issue 27). A
plain context sees all 132. The probe sizes its default grid from it (its `grid=`)."""

from __future__ import annotations

import pytest

from kubeletplugin.hooklayout import SIM_MPS_FILE, SIM_MPS_PIPE_ENV, SIM_MPS_THREADS_ENV, sim_mps_server_text
from tests.support.hook import kv


@pytest.mark.parametrize(("percentage", "own", "sms"), [(25, None, 34), (30, None, 40), (100, None, 132),
                                                        (50, "10", 14)])
def test_an_mps_client_sees_its_share_of_the_sms(make_claim, tmp_path, percentage, own, sms):
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / SIM_MPS_FILE).write_text(sim_mps_server_text("gpu0", percentage))
    env = {SIM_MPS_PIPE_ENV: str(pipe)} | ({SIM_MPS_THREADS_ENV: own} if own else {})
    out = kv(make_claim().run("gpushare-probe", "launch", "--seconds", 0.1, "--kernel-us", 10, env=env).stdout)
    assert int(out["grid"]) == sms


def test_a_plain_context_sees_the_whole_gpu(make_claim):
    out = kv(make_claim().run("gpushare-probe", "launch", "--seconds", 0.1, "--kernel-us", 10).stdout)
    assert int(out["grid"]) == 132
