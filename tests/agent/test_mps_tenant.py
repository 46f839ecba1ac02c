"""A tenant of an MPS claim against its compute share and memory budget (issue 20;
docs/strategies.md, docs/security.md). The node runs the plugin with the stand-in MPS control
daemon (playground/mpscontrol.py), which keeps its server's active-thread percentage
where the simulated driver reads it, so probes under an MPS claim's CDI spec are MPS clients of the
GPU's one server. Throughput is the probe's GPU work within its launch window relative to the GPU
alone (tests/hook/test_mps.py).

The MPS server holds an honest client to its share; the library holds the claim's processes
together to it in SM-time (a launch's GPU time times the SMs the driver says its context may use,
cuCtxGetExecAffinity; never the environment): so neither dropping the pipe folder (a plain
context), nor unsetting or raising CUDA_MPS_ACTIVE_THREAD_PERCENTAGE where the server's ceiling is
a larger claim's share, nor running several processes, gets a tenant more than its own share."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from playground.claims import gpushare_config, opaque_config
from playground.containers import PodmanRunner
from tests.support import BUILD, CPU_TIMED, podman_busybox_why_not
from tests.support.hook import MPS_HELD, throughput

MPS = [opaque_config(gpushare_config(sharingStrategy="MPS"))]
KERNEL_US = 200
PROBE = str(BUILD / "gpushare-probe")
# the probe's launch loop, as a tenant runs it, with kernels of the whole GPU's SMs (an MPS
# client's default grid is its share's: the simulated driver reports them, as real MPS does)
LAUNCH = ["launch", "--seconds", "2", "--kernel-us", str(KERNEL_US), "--grid", "132"]
# such a kernel, held by the client's share to fewer SMs than its grid asks for, runs at MPS_HELD
# of them, as on the H100: an honest client at 25 % does 0.25 * MPS_HELD of the GPU's solo work
HELD_25 = 0.25 * MPS_HELD
# what a tenant can do to the variables MPS reads (nvidia-cuda-mps-control(1))
DROP_PIPE = ("-u", "CUDA_MPS_PIPE_DIRECTORY")
DROP_THREADS = ("-u", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
RAISE_THREADS = ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",)


@pytest.fixture
def mps_node(node_factory):
    """A node with the stand-in daemon; MPS claims made through `claim` are unprepared at the end,
    which quits the GPU's control daemon (it is detached and would outlive the test)."""
    node = node_factory()  # every test node runs the stand-in daemon (tests/support/plugin.py)
    refs = []

    def claim(compute: int):
        ref, ids = node.claim(memory="1Gi", compute=compute, config=MPS)
        refs.append(ref)
        return ids

    yield node, claim
    for workload in node.workloads:
        workload.stop()
    for ref in refs:
        assert node.kubelet.unprepare(ref).claims[ref.uid].error == ""


def tenant(node, ids, *env_edits: str) -> float:
    """The probe under the claim's spec, its environment edited as a tenant can; its throughput."""
    w = node.runner.start_command("tenant", ids, ["env", *env_edits, PROBE, *LAUNCH])
    node.workloads.append(w)
    return throughput(w.read_until("launches=", timeout=60), KERNEL_US)


@CPU_TIMED
def test_raising_the_env_percentage_gets_no_more_than_the_share(mps_node):
    node, claim = mps_node
    ids = claim(25)
    claim(25)  # the server's ceiling: 25 %
    assert abs(tenant(node, ids) - HELD_25) <= 0.04  # an MPS client at its server's 25 %
    assert abs(tenant(node, ids, *RAISE_THREADS) - HELD_25) <= 0.04
    assert abs(tenant(node, ids, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10") - 0.10 * MPS_HELD) <= 0.03  # its own


@CPU_TIMED
def test_dropping_the_pipe_folder_gets_no_more_than_the_share(mps_node):
    """No MPS client: a plain context, which the library paces to the 25 % share (it measured
    1.00 of the GPU when the library left MPS claims unpaced)."""
    node, claim = mps_node
    ids = claim(25)
    got = tenant(node, ids, *DROP_PIPE)
    elsewhere = tempfile.mkdtemp(prefix="gs-no-mps")
    try:
        got_elsewhere = tenant(node, ids, f"CUDA_MPS_PIPE_DIRECTORY={elsewhere}")
    finally:
        shutil.rmtree(elsewhere)
    print(f"without its pipe folder the tenant did {got:.2f} of the GPU alone, pointed elsewhere {got_elsewhere:.2f}")
    assert abs(got - 0.25) <= 0.04 and abs(got_elsewhere - 0.25) <= 0.04


@CPU_TIMED
def test_unequal_shares_hold_without_the_env_percentage(mps_node):
    """MPS limits are per server: with a 25 % and a 50 % claim on one GPU the server's ceiling is
    50 %. The 25 % claim's tenant that unsets or raises its own percentage gets the server's 50 %
    of the SMs, so the library lets it run half the time: its share, never the neighbour's. The
    50 % claim keeps its 50 %."""
    node, claim = mps_node
    small, large = claim(25), claim(50)
    honest, unset, raised = (tenant(node, small, *edits) for edits in ((), DROP_THREADS, RAISE_THREADS))
    neighbour = tenant(node, large)
    print(f"25 % claim: honest {honest:.2f}, unset {unset:.2f}, raised {raised:.2f}; 50 % claim {neighbour:.2f}")
    assert abs(honest - HELD_25) <= 0.04
    assert unset <= 0.29 and raised <= 0.29
    assert abs(neighbour - 0.50 * MPS_HELD) <= 0.05


@CPU_TIMED
def test_several_processes_of_a_claim_share_its_share(mps_node):
    """The server's percentage holds each client, not the claim: three honest processes of one
    25 % claim would get 25 % each. The library holds them to 25 % together."""
    node, claim = mps_node
    ids = claim(25)
    workloads = [node.runner.start_command(f"tenant{i}", ids, ["env", PROBE, *LAUNCH]) for i in range(3)]
    node.workloads += workloads
    got = [throughput(w.read_until("launches=", timeout=60), KERNEL_US) for w in workloads]
    print("three processes of one 25 % MPS claim: " + " + ".join(f"{g:.2f}" for g in got) + f" = {sum(got):.2f}")
    assert sum(got) <= 0.30


NO_PODMAN = podman_busybox_why_not()
needs_podman = pytest.mark.skipif(NO_PODMAN is not None, reason=str(NO_PODMAN))


@pytest.mark.podman
@needs_podman
@CPU_TIMED
def test_a_container_that_rewrites_every_variable_gets_its_share_and_budget(node_factory):
    """In a real container (podman reads the plugin's CDI spec), a tenant of the 25 % claim, next
    to a 50 % claim, starts its workload with an emptied environment: no LD_PRELOAD, no GPUSHARE_*,
    no CUDA_MPS_*; then with the pipe folder kept but its share unset. Only the simulator's own
    plumbing (where its driver and state are, which a real driver's install provides) stays. The
    library still loads (/etc/ld.so.preload), reads the read-only limits file and holds both the
    25 % and the 256Mi budget."""
    node = node_factory(cdi_root=PodmanRunner.CDI_ROOT)
    runner = PodmanRunner(PROBE)
    refs = []
    try:
        (small, ids), (large, _) = (node.claim(memory=memory, compute=compute, config=MPS)
                                    for memory, compute in (("256Mi", 25), ("512Mi", 50)))
        refs += [small, large]
        keep = "$(/bin/env | /bin/grep -E '^(GPUSHARE_SIM_[A-Z_]*|LD_LIBRARY_PATH)=')"
        probe = "/usr/local/bin/gpushare-probe"

        def run(name: str, extra: str, argv: list[str], until: str) -> dict:
            w = runner.start_command(name, ids, ["/bin/sh", "-c", f"exec /bin/env -i {keep} {extra} {probe} "
                                                 + " ".join(argv)])
            node.workloads.append(w)
            return w.read_until(until, timeout=120)

        emptied = throughput(run("emptied", "", LAUNCH, "launches="), KERNEL_US)
        unset = throughput(run("unset", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", LAUNCH, "launches="), KERNEL_US)
        memory = run("memory", "", ["alloc", "--chunk", "64Mi", "--max", "1Gi"], "allocated=")
        print(f"emptied environment: {emptied:.2f} of the GPU; pipe kept, share unset: {unset:.2f}; "
              f"allocated {int(memory['allocated']) >> 20} MiB of a 256 MiB budget ({memory['result']})")
        assert emptied <= 0.29 and unset <= 0.29
        assert (int(memory["allocated"]), memory["result"]) == (256 << 20, "oom")
    finally:
        for w in node.workloads:
            w.stop()
        for ref in refs:
            node.kubelet.unprepare(ref)
        runner.close()
