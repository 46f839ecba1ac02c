"""Compute shares inside a shared MIG instance (docs/mig.md, "Compute inside a shared instance"):
two claims of one instance, both launching flat out, each held to its compute share by its library
in the slots the agent lays out for the MIG device, as on a whole GPU. NVML gives no utilization in
MIG mode, so the shares are the probes' own (launches x kernel time), not NVML's.

The simulator runs an instance's kernels on its GPU's one timeline (it does not model an
instance's SMs running beside other instances'), which is faithful here only because the one
instance is the only busy one."""

from __future__ import annotations

from tests.support import CPU_TIMED, wait_for
from tests.support.mig import share_instance

KERNEL_US = 2650  # the H100's 4096 matmul, as test_shares.py's 30/70


@CPU_TIMED
def test_two_claims_of_one_instance_hold_30_70(mig_node):
    node = mig_node
    a, ids_a = share_instance(node, "256Mi", 30)
    b, ids_b = share_instance(node, "256Mi", 70)
    wa = node.run("a", ids_a, "launch", "--seconds", "8", "--kernel-us", str(KERNEL_US))
    wb = node.run("b", ids_b, "launch", "--seconds", "8", "--kernel-us", str(KERNEL_US))
    # the two are laid out in one period of the MIG device, as two claims of a GPU are
    want = (0, 60000) if a.uid < b.uid else (140000, 60000)
    wait_for(lambda: node.plugin.agent.claims.get(a.uid) and (node.share(a).start_us, node.share(a).length_us) == want,
             what=f"claim a's slot {want}")
    outs = wa.read_until("launches=", timeout=30), wb.read_until("launches=", timeout=30)
    got = [float(o["launches"]) * KERNEL_US * 1e-6 / float(o["seconds"]) * 100 for o in outs]
    print(f"30/70 in one 1g.10gb instance, {KERNEL_US / 1000} ms kernels: {got[0]:.1f} / {got[1]:.1f}")
    assert abs(got[0] - 30) <= 4 and abs(got[1] - 70) <= 4, (got, outs)
