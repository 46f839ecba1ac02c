"""Sharing strategies at Prepare (docs/strategies.md): what each injects, and the configs that
cannot hold together once a DeviceClass's and a claim's configs are merged."""

from __future__ import annotations

import json
import os

from kubeletplugin.prepared import PreparedClaim
from playground.claims import gpushare_config, make_claim, opaque_config, result
from tests.support import GiB
from tests.support.cdi import env_of, load_spec


def limits_of(dirs, uid):
    with open(os.path.join(dirs.state, "claims", uid, "limits")) as f:
        return dict(line.split("=", 1) for line in f.read().splitlines() if line and not line.startswith("#"))


def prepare(api, kubelet, *configs, results=None):
    claim = make_claim(api, results or [result("gpu-0", consumed={"memory": "4Gi", "compute": "30"})],
                       config=list(configs))
    return claim, kubelet.prepare(claim).claims[claim.uid].error


def test_none_injects_nothing_but_is_recorded(api, kubelet, dirs):
    claim, error = prepare(api, kubelet, opaque_config(gpushare_config(sharingStrategy="None")))
    assert error == ""
    spec = load_spec(dirs, claim.uid)
    env = env_of(spec)
    assert env["GPUSHARE_SHARING_STRATEGY"] == "None" and env["GPUSHARE_CLAIM_UID"] == claim.uid
    assert "LD_PRELOAD" not in env and not any(k.startswith("GPUSHARE_MEMORY_LIMIT") for k in env)
    injected = ("/var/run/gpushare", "/etc/ld.so.preload", "/usr/local/gpushare/lib")
    assert not [m for m in spec["containerEdits"].get("mounts") or [] if m["containerPath"].startswith(injected)]
    folder = os.path.join(dirs.state, "claims", claim.uid)
    assert os.listdir(folder) == ["prepared.json"]
    with open(os.path.join(folder, "prepared.json")) as f:
        prepared = PreparedClaim.from_json(json.load(f))
    # the scheduler's view still holds: its memory and compute are recorded for the backstop and metrics
    assert prepared.sharing_strategy == "None"
    assert (prepared.gpus[0].memory_limit, prepared.gpus[0].compute_limit) == (4 * GiB, 30)


def test_default_is_time_slicing_and_a_claim_overrides_its_class(api, kubelet, dirs):
    plain, error = prepare(api, kubelet, opaque_config(gpushare_config(memoryLimit="2Gi")))
    assert error == "" and env_of(load_spec(dirs, plain.uid))["GPUSHARE_SHARING_STRATEGY"] == "TimeSlicing"
    # the class chose None; the claim's config, without sharingStrategy, keeps it
    kept, error = prepare(api, kubelet, opaque_config(gpushare_config(sharingStrategy="None"), source="FromClass"),
                          opaque_config(gpushare_config(memoryLimit="2Gi")))
    assert error == "" and env_of(load_spec(dirs, kept.uid))["GPUSHARE_SHARING_STRATEGY"] == "None"
    chosen, error = prepare(api, kubelet, opaque_config(gpushare_config(sharingStrategy="None"), source="FromClass"),
                            opaque_config(gpushare_config(sharingStrategy="TimeSlicing")))
    assert error == "" and "LD_PRELOAD" in env_of(load_spec(dirs, chosen.uid))


def test_class_strategy_and_claim_burst_refused_naming_both(api, kubelet, dirs):
    _, error = prepare(api, kubelet, opaque_config(gpushare_config(computePolicy="Burst")),
                       opaque_config(gpushare_config(sharingStrategy="None"), source="FromClass"))
    assert error == ("status.allocation.devices.config[0].opaque.parameters.computePolicy: Burst needs "
                     "sharingStrategy TimeSlicing; under None nothing paces the claim (got 'Burst'; sharingStrategy "
                     "None from status.allocation.devices.config[1])")
    _, error = prepare(api, kubelet, opaque_config(gpushare_config(sharingStrategy="None"), source="FromClass"),
                       opaque_config(gpushare_config(computeLimit=20)))
    assert error.startswith("status.allocation.devices.config[1].opaque.parameters.computeLimit: sharingStrategy "
                            "None enforces no compute share"), error


def test_one_strategy_per_claim(api, kubelet, dirs):
    _, error = prepare(api, kubelet, opaque_config(gpushare_config(sharingStrategy="None"), requests=["a"]),
                       results=[result("gpu-0-share-0", request="a"), result("gpu-1-share-0", request="b")])
    assert error == ("status.allocation.devices.config: one sharingStrategy per claim: its GPUs got None "
                     "(status.allocation.devices.config[0]), TimeSlicing (the default)")
    _, error = prepare(api, kubelet, opaque_config(gpushare_config(sharingStrategy="MPS")),
                       results=[result("gpu-0-share-0", request="a"), result("gpu-1-share-0", request="b")])
    assert error == ("status.allocation.devices.results: sharingStrategy MPS (status.allocation.devices.config[0]) "
                     "serves one GPU per claim (got GPUs 0, 1)")


def test_mps_claim_gets_the_gpus_pipe_and_its_share_in_the_limits_file(api, kubelet, dirs):
    claim, error = prepare(api, kubelet, opaque_config(gpushare_config(sharingStrategy="MPS")))
    assert error == ""
    spec = load_spec(dirs, claim.uid)
    env = env_of(spec)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30" and env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    uuid0 = env["GPUSHARE_DEVICE_UUID_0"]
    assert mounts["/tmp/nvidia-mps"] == os.path.join(dirs.state, "mps", uuid0, "pipe")
    # the library holds the memory budget, and paces to the share any process the MPS server does
    # not hold to it: it checks a client's SMs against the GPU's (tests/agent/test_mps_tenant.py)
    limits = limits_of(dirs, claim.uid)
    assert limits["GPUSHARE_MEMORY_LIMIT_0"] == str(4 * GiB) and limits["GPUSHARE_COMPUTE_LIMIT_0"] == "30"
    assert limits["GPUSHARE_SHARING_STRATEGY"] == "MPS" and limits["GPUSHARE_SM_COUNT_0"] == "132"
    kubelet.unprepare(claim)  # the GPU's last MPS claim: its control daemon stops
    assert not os.path.exists(os.path.join(dirs.state, "mps", uuid0))


def test_one_claim_of_each_strategy_on_one_gpu_gets_its_own_injection(api, kubelet, dirs):
    """What Prepare injects for each on one GPU: library, MPS percentage, compute in the limits
    file. What each then holds, running: tests/agent/test_strategies_side_by_side.py."""
    held = {}
    claims = []
    for n, strategy in enumerate(("TimeSlicing", "MPS", "None")):
        claim, error = prepare(api, kubelet, opaque_config(gpushare_config(sharingStrategy=strategy)),
                               results=[result(f"gpu-0-share-{n}")])
        assert error == "", error
        claims.append(claim)
        env = env_of(load_spec(dirs, claim.uid))
        folder = os.path.join(dirs.state, "claims", claim.uid)
        held[strategy] = (env.get("LD_PRELOAD") is not None, env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                          limits_of(dirs, claim.uid)["GPUSHARE_COMPUTE_LIMIT_0"] if "limits" in os.listdir(folder)
                          else None)
    assert held == {"TimeSlicing": (True, None, "25"),  # library paces to the 25 % share
                    "MPS": (True, "25", "25"),          # the server holds compute, the library the rest
                    "None": (False, None, None)}        # nothing injected
    for claim in claims:
        kubelet.unprepare(claim)


def test_latency_claim_needs_mps_and_gets_normal_mps_priority_beside_batch(api, kubelet, dirs):
    """`priority: Latency` (docs/compute.md, "Latency"): refused on a time-sliced claim naming the
    field, its entry and where the strategy came from; under MPS its client's streams get MPS's
    NORMAL priority, a Batch claim's BELOW_NORMAL, and the choice survives in prepared.json."""
    _, error = prepare(api, kubelet, opaque_config(gpushare_config(priority="Latency")))
    assert error == ("status.allocation.devices.config[0].opaque.parameters.priority: Latency needs sharingStrategy "
                     "MPS (the DeviceClass mps.gpushare.dev): under TimeSlicing a request waits for the other "
                     "contexts' time slice and a context switch (got 'Latency'; sharingStrategy TimeSlicing by "
                     "default)")
    _, error = prepare(api, kubelet, opaque_config(gpushare_config(sharingStrategy="None"), source="FromClass"),
                       opaque_config(gpushare_config(priority="Latency")))
    assert error.startswith("status.allocation.devices.config[1].opaque.parameters.priority: Latency needs "), error
    assert error.endswith("(got 'Latency'; sharingStrategy None from status.allocation.devices.config[0])"), error
    mps_class = opaque_config(gpushare_config(sharingStrategy="MPS"), source="FromClass")
    latency, error = prepare(api, kubelet, mps_class, opaque_config(gpushare_config(priority="Latency")),
                             results=[result("gpu-0-share-0")])
    assert error == ""
    batch, error = prepare(api, kubelet, mps_class, results=[result("gpu-0-share-1")])
    assert error == ""
    assert env_of(load_spec(dirs, latency.uid))["CUDA_MPS_CLIENT_PRIORITY"] == "0"
    assert env_of(load_spec(dirs, batch.uid))["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    for claim, priority in ((latency, "Latency"), (batch, "Batch")):
        with open(os.path.join(dirs.state, "claims", claim.uid, "prepared.json")) as f:
            assert PreparedClaim.from_json(json.load(f)).priority == priority
        kubelet.unprepare(claim)
