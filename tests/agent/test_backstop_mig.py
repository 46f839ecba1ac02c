"""The node agent on claims that share a MIG instance (capacity mode, docs/mig.md): the simulated
NVML answers as real NVML does in MIG mode (hook/sim/sim_nvml.c: a process in an instance is listed
on its MIG device's handle; no utilization), and the agent samples each MIG device by its own UUID,
the one the claim names. A tenant that bypasses the library and holds more than its claim's
budget of the instance is killed, with the Event, and the other claim of the instance is not; the
claims' processes are counted."""

from __future__ import annotations

import threading

from tests.support import MiB, wait_for
from tests.support.backstop import escape, events
from tests.support.mig import device_uuid, share_instance


def test_a_tenant_bypassing_the_library_in_a_shared_mig_instance_is_killed_and_its_neighbour_is_not(mig_node):
    node = mig_node
    a, ids_a = share_instance(node, "256Mi", 50)
    b, ids_b = share_instance(node, "1Gi", 50)
    uuid = device_uuid(node, a)
    assert uuid.startswith("MIG-") and device_uuid(node, b) == uuid  # one instance, made at Prepare
    neighbour = node.run("neighbour", ids_b, "alloc", "--chunk", "64Mi", "--max", "64Mi", "--hold", "60")
    assert neighbour.read_until("allocated=", timeout=20)["allocated"] == str(64 * MiB)
    tenant = escape(node, ids_a, read=False)  # 512 MiB around the library, against a budget of 256
    tenant.proc.wait(timeout=10)
    assert tenant.proc.returncode == -9
    evs = wait_for(lambda: events(node, a))
    assert f"killed pid(s) {tenant.proc.pid}" in evs[0].message and f"on GPU {uuid} (NVML)" in evs[0].message
    wait_for(lambda: node.claim_metric("gpushare_claim_backstop_kills_total", a) == 1)
    # the neighbour, in the same instance and within its budget: untouched, its process counted
    wait_for(lambda: node.claim_metric("gpushare_claim_memory_nvml_bytes", b) == 64 * MiB)
    assert neighbour.running() and events(node, b) == []
    assert node.claim_metric("gpushare_claim_backstop_violations_total", b) == 0
    assert wait_for(lambda: node.share(b).procs == 1)
    assert node.claim_metric("gpushare_claim_utilization_ratio", b) is None  # NVML has none in MIG mode
    # the per-GPU metrics stay the whole GPUs' (the MIG device is a part of GPU 3)
    assert {dict(labels)["UUID"][:4] for labels in node.scrape()["gpushare_gpu_memory_used_bytes"]} == {"GPU-"}


def test_mig_devices_are_listed_again_for_a_device_not_looked_for_yet_never_at_every_poll(mig_node, monkeypatch):
    """The backstop's query finds an instance made after the agent's last period (one listing of
    the MIG devices), and a UUID no listing finds costs no listing at the next polls."""
    node = mig_node
    sampler = node.plugin.agent._sampler
    listings = []  # this thread's (the agent's period lists them too, on its own)
    here = threading.get_ident()
    original = sampler.list_migs
    monkeypatch.setattr(sampler, "list_migs", lambda: (threading.get_ident() == here and listings.append(1),
                                                       original())[1])
    ref, _ = share_instance(node, "256Mi", 50)
    uuid = device_uuid(node, ref)
    # as before the instance was made (the agent's period, every 0.5 s, may have listed it since)
    sampler._devices = dict(zip(sampler._uuids, sampler._handles, strict=True))
    assert sampler.process_memory({uuid}) == {uuid: {}}  # listed once, then read: no process yet
    assert listings == [1]
    for _ in range(5):
        assert sampler.process_memory({uuid, "MIG-no-such-device"}) == {uuid: {}}
    assert listings == [1, 1]  # the unknown one looked for once

