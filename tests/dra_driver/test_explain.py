"""gpushare-dra explain: each GPU's free memory and compute for a claim that is not allocated,
from ResourceSlices and allocated ResourceClaims as the API server holds them."""

from __future__ import annotations

from dra_driver.controller.pending import message
from dra_driver.explain import explain

DRIVER = "gpushare.dev"


def capacity_slice(node: str, *gpus: str) -> dict:
    return {"spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node}, "devices": [
        {"name": f"gpu-{i}", "capacity": {
            "memory": {"value": size, "requestPolicy": {"default": "10Gi"}},
            "compute": {"value": "100"}}} for i, size in enumerate(gpus)]}}


def partition_slice(node: str, shares: int = 4) -> dict:
    return {"spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node}, "devices": [
        {"name": f"gpu-0-share-{j}", "capacity": {"memory": {"value": "20Gi"}, "compute": {"value": "25"}}}
        for j in range(shares)]}}


def allocated(name: str, node: str, device: str, **consumed: str) -> dict:
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device,
              **({"consumedCapacity": consumed} if consumed else {})}
    return {"metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}"},
            "status": {"allocation": {"devices": {"results": [result]}}}}


def pending(name: str = "big", **asked: str) -> dict:
    exactly = {"deviceClassName": DRIVER, **({"capacity": {"requests": asked}} if asked else {})}
    return {"metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def test_a_claim_that_fits_a_gpus_size_but_no_gpus_free_capacity():
    slices = [capacity_slice("node-a", "80Gi", "80Gi")]
    claims = [allocated("a", "node-a", "gpu-0", memory="60Gi", compute="30"),
              allocated("b", "node-a", "gpu-1", memory="20Gi", compute="90")]
    assert explain(pending(memory="30Gi", compute="20"), slices, claims, DRIVER) == [
        "ResourceClaim default/big: not allocated; the GPUs of gpushare.dev and what they have free now:",
        "request 'gpu' (gpushare.dev): memory 30Gi, compute 20",
        "  node-a gpu-0: memory 20Gi free of 80Gi, compute 70 free of 100 -> no: memory 30Gi asked, 20Gi free",
        "  node-a gpu-1: memory 60Gi free of 80Gi, compute 10 free of 100 -> no: compute 20 asked, 10 free",
        "no GPU fits now: the claim waits until claims on a GPU are deleted, or a request asks less"]


def test_rounding_defaults_a_whole_gpu_and_a_fit():
    slices = [capacity_slice("node-a", "80Gi", "80Gi")]
    claims = [allocated("whole", "node-a", "gpu-0")]  # no consumedCapacity: the GPU whole
    lines = explain(pending(memory="1000Mi", compute="12.5"), slices, claims, DRIVER)
    assert lines[1] == "request 'gpu' (gpushare.dev): memory 1000Mi, compute 12.5"
    assert lines[2] == "  node-a gpu-0: memory 80Gi, compute 100: taken whole by a claim -> no: taken whole by a claim"
    assert lines[3].endswith("-> fits") and lines[-1].startswith("a GPU fits now")
    # memory without compute: all of the GPU's time, which a used GPU does not have
    lines = explain(pending(memory="1Gi"), slices, [allocated("a", "node-a", "gpu-1", memory="1Gi", compute="1")],
                    DRIVER)
    assert lines[1] == "request 'gpu' (gpushare.dev): memory 1Gi, compute 100 (the default: the whole GPU's time)"
    assert lines[3] == ("  node-a gpu-1: memory 79Gi free of 80Gi, compute 99 free of 100 -> no: compute 100 "
                        "asked, 99 free")
    # more than a GPU has
    assert explain(pending(memory="100Gi", compute="10"), slices, [], DRIVER)[2].endswith(
        "-> no: memory 100Gi asked, 80Gi free (more than the GPU has)")


def test_partition_shares_and_an_allocated_claim():
    slices = [partition_slice("node-b")]
    claims = [allocated("s", "node-b", "gpu-0-share-1"), allocated("t", "node-b", "gpu-0-share-2")]
    lines = explain(pending(memory="4Gi", compute="10"), slices, claims, DRIVER)
    assert lines[2] == ("  node-b gpu-0: 2 of 4 shares free (each memory 20Gi) -> no: partition-mode shares; "
                        "capacity asks need capacity-mode GPUs")
    assert explain(pending(), slices, claims, DRIVER)[2].endswith("-> fits")
    assert explain(claims[0], slices, claims, DRIVER) == [
        "ResourceClaim default/s: allocated (node-b/gpu-0-share-1)"]
    assert explain(pending(), [], [], DRIVER)[1] == \
        "  no ResourceSlice of gpushare.dev publishes a GPU: is the kubelet plugin running?"


def test_a_tainted_gpu_does_not_fit_unless_the_request_tolerates_its_taint():
    slices = capacity_slice("node-a", "80Gi", "80Gi")
    slices["spec"]["devices"][0]["taints"] = [{"key": "gpushare.dev/unhealthy", "value": "xid-79",
                                               "effect": "NoSchedule"}]
    slices["spec"]["devices"][1]["taints"] = [{"key": "example.com/info", "effect": "None"}]  # keeps nobody off
    lines = explain(pending(memory="1Gi", compute="10"), [slices], [], DRIVER)
    assert lines[2] == ("  node-a gpu-0: memory 80Gi free of 80Gi, compute 100 free of 100 -> no: tainted "
                        "gpushare.dev/unhealthy=xid-79:NoSchedule and the request does not tolerate it")
    assert lines[3].endswith("-> fits")
    tolerant = pending(memory="1Gi", compute="10")
    exactly = tolerant["spec"]["devices"]["requests"][0]["exactly"]
    for toleration, fits in [({"key": "gpushare.dev/unhealthy", "operator": "Exists"}, True),
                             ({"key": "gpushare.dev/unhealthy", "value": "xid-79", "effect": "NoSchedule"}, True),
                             ({"operator": "Exists"}, True),
                             ({"key": "gpushare.dev/unhealthy", "value": "xid-48"}, False),
                             ({"key": "gpushare.dev/unhealthy", "operator": "Exists", "effect": "NoExecute"}, False)]:
        exactly["tolerations"] = [toleration]
        assert explain(tolerant, [slices], [], DRIVER)[2].endswith("-> fits") is fits, toleration
    # the controller's NoGpuFits Event says so when every GPU is kept off by its taint
    slices["spec"]["devices"][1]["taints"] = slices["spec"]["devices"][0]["taints"]
    text = message(pending(memory="1Gi", compute="10"), [slices], [], DRIVER)
    assert text is not None and text.count("tainted gpushare.dev/unhealthy=xid-79:NoSchedule") == 2
