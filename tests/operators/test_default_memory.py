"""A request that asks for compute and no memory gets a default memory that leaves the rest of
the GPU to others (1/8 of it, the devices' requestPolicy default), and its author is told so
at apply time; a request that asks for nothing is still a whole GPU, memory included.

Against the controller's real slices, the playground's allocation stand-in (which applies
requestPolicy as the scheduler does), the kubelet plugin's limits (allocation.plan_claim) and
the shipped warning policy. A real cluster must confirm the same consumedCapacity from
kube-scheduler (tests/cluster)."""

from __future__ import annotations

import pytest
import yaml

from dra_driver import devicemodel
from dra_driver.controller import slices
from dra_driver.discovery import GpuInfo
from kubeletplugin.allocation import plan_claim
from playground.allocator import AllocationError
from playground.emulator import admission
from tests.support.deploy import DEPLOY
from tests.support.kubectl import Kubectl, needs_kubectl
from tests.support.shapes import NODE, allocate_on, claim, exactly, results, with_status

GiB = 2**30
GPU = GpuInfo(0, "GPU-0000", 0, "NVIDIA H100 80GB HBM3", 80 * GiB, "Hopper", "9.0", "580.65.06", "13.0")
POLICIES = DEPLOY / "base" / "admission-requests.yaml"
WARN = next(d for d in yaml.safe_load_all(POLICIES.read_text()) if d and d["kind"] == "ValidatingAdmissionPolicy"
            and d["metadata"]["name"] == "gpushare.dev-requests-warnings")


def published(gpu: GpuInfo = GPU) -> list[dict]:
    devices = slices.desired_devices([gpu], devicemodel.CAPACITY, 8, taints=True)
    return [slices.with_generation(s, 1) for s in slices.desired_slices(NODE, "gpushare.dev", devices, None)]


def allocated(capacity: dict | None, others=()) -> dict:
    c = claim(exactly(capacity=capacity))
    return with_status(c, allocate_on(c, published(), allocated=list(others)))


def limits(c: dict) -> tuple[int, int]:
    [gpu] = plan_claim(c, "gpushare.dev", NODE, {0: GPU}, 8).gpus
    return gpu.memory_limit, gpu.compute_limit


@pytest.mark.parametrize("memory,default", [(80 * GiB, 10 * GiB), (24 * GiB, 3 * GiB), (141 * GiB, 17920 * 2**20),
                                            (2**29, 2**28)])
def test_default_memory_is_an_eighth_on_the_step(memory, default):
    assert devicemodel.default_memory(GpuInfo(0, "GPU-x", 0, "x", memory, "x", "9.0", "1", "1")) == default


def test_compute_only_claim_gets_the_default_memory_and_leaves_the_rest():
    first = allocated({"compute": "10"})
    [result] = results(first["status"])
    assert result["consumedCapacity"] == {"memory": "10Gi", "compute": "10"}
    assert limits(first) == (10 * GiB, 10)
    # Seven more fit beside it (8 x 10Gi = the GPU); a ninth finds no memory left.
    held = [first]
    for _ in range(7):
        held.append(allocated({"compute": "10"}, held))
    with pytest.raises(AllocationError, match="memory"):
        allocated({"compute": "10"}, held)


def test_a_claim_asking_for_nothing_is_the_whole_gpu():
    whole = allocated(None)
    [result] = results(whole["status"])
    assert result["consumedCapacity"] == {"memory": "10Gi", "compute": "100"}  # what the scheduler books
    assert limits(whole) == (80 * GiB, 100)  # the plugin: nobody else can share it, so all its memory
    with pytest.raises(AllocationError, match="compute"):
        allocated({"memory": "1Gi", "compute": "1"}, [whole])


def test_memory_only_claim_keeps_its_memory_and_holds_the_gpu():
    c = allocated({"memory": "4Gi"})
    assert results(c["status"])[0]["consumedCapacity"] == {"memory": "4Gi", "compute": "100"}
    assert limits(c) == (4 * GiB, 100)


def test_all_of_the_compute_and_no_memory_is_the_whole_gpu():
    """compute: "100" and no memory holds the GPU alone: all its memory, and no warning."""
    c = allocated({"compute": "100"})
    assert results(c["status"])[0]["consumedCapacity"] == {"memory": "10Gi", "compute": "100"}
    assert limits(c) == (80 * GiB, 100)
    assert warning({"compute": "100"}) is None


def test_a_claim_booked_by_an_older_controller_keeps_its_whole_gpu():
    """Slices published before the default changed (memory default = all of it): same limits."""
    old = published()
    old[0]["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["default"] = "80Gi"
    c = claim(exactly(capacity={"compute": "10"}))
    c = with_status(c, allocate_on(c, old))
    assert limits(c) == (80 * GiB, 10)


def warning(capacity: dict | None) -> str | None:
    ask = {"deviceClassName": "gpushare.dev", **({"capacity": {"requests": capacity}} if capacity else {})}
    obj = {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": ask}]}}}
    request = admission.request_attributes("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", "CREATE",
                                           "default", "c")
    # the requests' validation (the policy's second one, about configs, has none to look at here)
    decision, configs = admission.validate(WARN["spec"], admission.activation(WARN["spec"], obj, None, request))
    assert not decision.error and not configs.error and not configs.denied, (decision, configs)
    return decision.message if decision.denied else None


def test_the_author_is_told_at_apply_time():
    assert warning({"compute": "10"}) == (
        "spec.devices.requests[0].exactly.capacity.requests: asks for compute and no memory: it gets the "
        "default, 1/8 of the GPU's memory (10Gi of an 80Gi GPU); add memory to choose it")
    assert warning({"gpushare.dev/memory": "4Gi"}) == (
        "spec.devices.requests[0].exactly.capacity.requests: asks for memory and no compute: it holds all of "
        "the GPU's time (compute default 100), so no other claim shares its GPU; add compute (percent) to share it")
    assert warning(None) is None  # a whole GPU, on purpose
    assert warning({"memory": "4Gi", "compute": "10"}) is None


@needs_kubectl
def test_kubectl_prints_the_warning(emulator, tmp_path):
    k = Kubectl(tmp_path, kubeconfig=emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    k("apply", "-f", POLICIES, "-f", DEPLOY / "base" / "deviceclass.yaml")
    body = claim(exactly(capacity={"compute": "10"}), name="compute-only")
    body["metadata"] = {"name": "compute-only"}
    out = k.run("apply", "-f", "-", input=yaml.safe_dump(body))
    assert out.stdout.strip() == "resourceclaim.resource.k8s.io/compute-only created"
    assert "Warning: " in out.stderr and "asks for compute and no memory: it gets the default, 1/8" in out.stderr
