"""MIG publishing (docs/mig.md): a GPU in MIG mode that --mig-gpus names is published as one device
per profile placement, each consuming the GPU's shared counters (KEP 4815), in slices the API
accepts; the scheduler's counting (the playground's allocator) never books overlapping placements."""

from __future__ import annotations

import kubernetes_validate
import pytest

from dra_driver.controller import slices
from dra_driver.discovery import MockBackend
from dra_driver.mig import NO_MIG, GpuSet
from playground.allocator import core
from tests.support.mig import mig_gpu
from tests.support.nvml import needs_sim

pytestmark = needs_sim
GiB = 2**30


def h100(mig_gpus="0", mode="capacity", n=1):
    gpus = MockBackend(f"{n}x80Gi").discover()
    gpus[0] = mig_gpu(gpus[0])
    devices = slices.desired_devices(gpus, mode, 8, True, mig_gpus=GpuSet.parse(mig_gpus))
    return slices.desired_slices("node-a", "gpushare.dev", devices, "uid-1",
                                 slices.mig_counter_sets(gpus, GpuSet.parse(mig_gpus)))


def test_each_placement_is_a_device_consuming_the_gpus_counters():
    device_slice, counter_slice = h100()
    devices = {d["name"]: d for d in device_slice["spec"]["devices"]}
    # NVIDIA's H100 80GB placements: 7 + 7 (+me) + 4 + 3 + 2 + 1 + 1
    assert len(devices) == 25
    assert [n for n in devices if "-3g-" in n] == ["gpu-0-mig-3g-40gb-0", "gpu-0-mig-3g-40gb-4"]
    assert list(devices)[:2] == ["gpu-0-mig-1g-10gb-6", "gpu-0-mig-1g-10gb-5"]  # small ones from the top
    d = devices["gpu-0-mig-3g-40gb-4"]
    shown = ("type", "profile", "multiprocessors", "parentUUID", "placementStart")
    assert {k: v for k, v in d["attributes"].items() if k in shown} == {
        "type": {"string": "mig"}, "profile": {"string": "3g.40gb"}, "multiprocessors": {"int": 60},
        "parentUUID": {"string": "GPU-5ea1c0de-0000-4000-8000-000000000000"}, "placementStart": {"int": 4}}
    assert "sharingStrategy" not in d["attributes"] and "uuid" not in d["attributes"]
    # capacity mode: claims may share the instance, asking for slices of it (docs/mig.md)
    assert d["allowMultipleAllocations"] is True
    assert d["capacity"]["memory"] == {"value": "40448Mi", "requestPolicy": {
        "default": "40448Mi", "validRange": {"min": "256Mi", "step": "256Mi", "max": "40448Mi"}}}
    assert d["capacity"]["compute"]["requestPolicy"]["default"] == "100"  # asking for none: the instance whole
    [partitioned, _] = h100(mode="partition")
    assert {k: v for k, v in partitioned["spec"]["devices"][0].items() if k in ("allowMultipleAllocations",
                                                                             "capacity")} == {
        "capacity": {"memory": {"value": "9984Mi"}, "compute": {"value": "100"}}}
    [consumed] = d["consumesCounters"]
    assert consumed["counterSet"] == "gpu-0-mig"
    assert {k: v["value"] for k, v in consumed["counters"].items()} == {
        "memory-slice-4": "1", "memory-slice-5": "1", "memory-slice-6": "1", "memory-slice-7": "1",
        "compute-slice-4": "1", "compute-slice-5": "1", "compute-slice-6": "1",
        "multiprocessors": "60", "copy-engines": "3", "decoders": "3", "jpeg-engines": "3"}
    assert "devices" not in counter_slice["spec"]  # the API wants counters apart from devices
    [counters] = counter_slice["spec"]["sharedCounters"]
    assert counters["name"] == "gpu-0-mig"
    assert {k: v["value"] for k, v in counters["counters"].items()} == {
        **{f"memory-slice-{k}": "1" for k in range(8)}, **{f"compute-slice-{k}": "1" for k in range(7)},
        "multiprocessors": "132", "copy-engines": "8", "decoders": "7", "jpeg-engines": "7", "ofa-engines": "1"}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in (device_slice, counter_slice)} == {2}


@pytest.mark.parametrize("kube_version", ["1.35", kubernetes_validate.utils.latest_version()])
def test_mig_slices_valid_against_upstream_schema(kube_version):
    for s in h100(n=2):
        kubernetes_validate.validate(slices.with_generation(s, 1), kube_version, strict=True)


def test_only_the_operators_choice():
    gpus = MockBackend("2x80Gi").discover()
    gpus[0] = mig_gpu(gpus[0])
    # MIG mode without --mig-gpus: not offered at all (CUDA cannot use a GPU in MIG mode whole)
    names = [d["name"] for d in slices.desired_devices(gpus, "capacity", 8, True, mig_gpus=NO_MIG)]
    assert names == ["gpu-1"]
    # --mig-gpus naming a GPU whose MIG mode is off: published as before
    names = [d["name"] for d in slices.desired_devices(gpus, "capacity", 8, True, mig_gpus=GpuSet.parse("all"))]
    assert names[-1] == "gpu-1" and all(n.startswith("gpu-0-mig-") for n in names[:-1])
    assert slices.mig_counter_sets(gpus, GpuSet.parse("1")) == []
    # and the plugin's log says why GPU 1 offers no MIG devices
    assert "GPU 1 (GPU-5ea1c0de-0000-4000-8000-000000000001) is named by --mig-gpus but its MIG mode is disabled" \
        in slices.mig_note(gpus[1], GpuSet.parse("all"))
    assert slices.mig_note(gpus[1], NO_MIG) is None
    assert slices.mig_note(gpus[0], GpuSet.parse("0")).endswith("offered as MIG devices: 1g.10gb, 2g.20gb, 3g.40gb, "
                                                               "4g.40gb, 7g.80gb, 1g.10gb+me, 1g.20gb")
    with pytest.raises(ValueError, match="^'x': expected none, all, or GPU indexes like 0,2"):
        GpuSet.parse("x")


def claim(name, profile):
    """A claim of one MIG device of `profile`; `3g.40gb:8Gi:30` asks for that slice of it."""
    profile, *share = profile.split(":")
    selector = f'device.attributes["gpushare.dev"].profile == "{profile}"'
    exactly = {"deviceClassName": "mig.gpushare.dev", "selectors": [{"cel": {"expression": selector}}]}
    if share:
        exactly["capacity"] = {"requests": {"memory": share[0], "compute": share[1]}}
    return {"metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "mig", "exactly": exactly}]}}}


MIG_CLASS = {"metadata": {"name": "mig.gpushare.dev"}, "spec": {"selectors": [{"cel": {"expression":
             'device.driver == "gpushare.dev" && device.attributes["gpushare.dev"].type == "mig"'}}]}}


def allocate_in_turn(profiles):
    """Each claim allocated beside the ones before it: the device each got, or None if it stays Pending."""
    published = [slices.with_generation(s, 1) for s in h100()]
    allocated, got = [], []
    for n, profile in enumerate(profiles):
        c = claim(f"c{n}", profile)
        try:
            c["status"] = core.allocate(c, node_name="node-a", slices=published, device_classes=[MIG_CLASS],
                                        allocated_claims=allocated)
        except core.AllocationError as e:
            got.append(None)
            assert "counter gpu-0-mig/memory-slice-" in str(e) or "compute: needs" in str(e), str(e)
            continue
        allocated.append(c)
        got.append(c["status"]["allocation"]["devices"]["results"][0]["device"])
    return got


def test_the_scheduler_never_books_overlapping_placements():
    # two 3g.40gb take all 8 memory slices: a 1g.10gb no longer fits (NVIDIA: 3g+3g is a full GPU)
    assert allocate_in_turn(["3g.40gb", "3g.40gb", "1g.10gb"]) == [
        "gpu-0-mig-3g-40gb-0", "gpu-0-mig-3g-40gb-4", None]
    # a 3g.40gb, a 2g.20gb and a 1g.10gb fill it: memory slice 7 has no 1g.10gb placement
    assert allocate_in_turn(["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb", "1g.10gb"]) == [
        "gpu-0-mig-3g-40gb-0", "gpu-0-mig-2g-20gb-4", "gpu-0-mig-1g-10gb-6", None, None]


def test_claims_share_an_instance_in_slices_and_take_its_counters_once():
    # a whole 3g.40gb, then three slices of one: they share the second placement's instance
    # until its compute is gone; the 1g.10gb that does not fit beside the two stays Pending
    assert allocate_in_turn(["3g.40gb", "3g.40gb:8Gi:30", "3g.40gb:16Gi:50", "3g.40gb:4Gi:30", "1g.10gb"]) == [
        "gpu-0-mig-3g-40gb-0", "gpu-0-mig-3g-40gb-4", "gpu-0-mig-3g-40gb-4", None, None]


def test_a_server_that_drops_the_counters_is_noticed():
    device_slice, counter_slice = h100()
    dropped = {**device_slice, "spec": {**device_slice["spec"], "devices": [
        {k: v for k, v in d.items() if k != "consumesCounters"} for d in device_slice["spec"]["devices"]]}}
    assert slices.counters_kept(device_slice, device_slice) and slices.counters_kept(counter_slice, counter_slice)
    assert not slices.counters_kept(device_slice, dropped)
    assert not slices.counters_kept(counter_slice, {"spec": {k: v for k, v in counter_slice["spec"].items()
                                                             if k != "sharedCounters"}})
    plain = slices.desired_slices("node-a", "gpushare.dev", slices.desired_devices(
        MockBackend("1x80Gi").discover(), "capacity", 8, True), None)[0]
    assert slices.counters_kept(plain, {})  # nothing to keep
