"""A tenant that allocates around the library (the probe without LD_PRELOAD, inside its claim's
mapping: the region never sees the memory, NVML does), and the backstop's Events on a claim
(tests/agent/test_backstop.py, test_backstop_mig.py)."""

from __future__ import annotations

from kubernetes import client

from . import MiB

UNHOOKED = ("-u", "LD_PRELOAD")  # argv of /usr/bin/env before the probe


def escape(node, ids, name="escape", read=True):
    """A process of the claim that allocates 512 MiB the library does not see."""
    probe = node.runner.probe
    node.runner.probe = "/usr/bin/env"
    try:
        w = node.run(name, ids, *UNHOOKED, probe, "alloc", "--chunk", "512Mi", "--max", "512Mi", "--hold", "30")
    finally:
        node.runner.probe = probe
    if read:  # (a kill may come before the line)
        assert w.read_until("allocated=", timeout=20)["allocated"] == str(512 * MiB)
    return w


def events(node, ref):
    items = client.CoreV1Api(node.api).list_namespaced_event(ref.namespace).items
    return [e for e in items if e.involved_object.uid == ref.uid and e.reason == "GpuMemoryLimitExceeded"]
