"""MPS on the simulated GPU (hook/sim, calibration in docs/compute.md): clients of one server run
their kernels at the same time, each on the SMs its grid asks for up to the active-thread
percentage its server's file gives it (hook/sim/sim_mps.h). Throughput is each client's GPU work
done within its launch window (`done_in_window` kernels of known length), relative to the GPU
alone: 1.0 is one client's worth of work at full speed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kubeletplugin.hooklayout import SIM_MPS_FILE, SIM_MPS_PIPE_ENV, SIM_MPS_THREADS_ENV, sim_mps_server_text
from tests.support import CPU_TIMED
from tests.support.hook import MPS_HELD, kv, throughput

SECONDS = 2
LARGE_US = 500  # a kernel of the GPU's SM count in blocks (WHOLE)
WHOLE = ("--grid", 132)  # the GPU's SM count: an MPS client's default grid is its share's (issue 27)
SMALL_US, SMALL_GRID = 410, 33  # a batch-1 inference kernel on a quarter of the 132 SMs
HELD = MPS_HELD  # a kernel held by its share to fewer SMs than its grid asks: 0.82 of them


def pipe_dir(tmp_path: Path, name: str, percentage: int, server: str = "gpu0") -> Path:
    """A pipe directory where the trusted side has started a simulated MPS server."""
    d = tmp_path / "mps" / name
    d.mkdir(parents=True)
    (d / SIM_MPS_FILE).write_text(sim_mps_server_text(server, percentage))
    return d


def run_together(claim, clients: list[tuple[dict, list]]) -> list[dict]:
    """Start every (env, probe args) at once; their outputs"""
    procs = [claim.popen("gpushare-probe", "launch", "--seconds", SECONDS, *args, env=env) for env, args in clients]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        outs.append(kv(stdout))
    return outs


@CPU_TIMED
def test_two_small_kernel_clients_together_do_more_than_one(make_claim, tmp_path):
    claim = make_claim()  # the library for memory only (compute 100), as under the MPS strategy
    small = ["--kernel-us", SMALL_US, "--grid", SMALL_GRID]
    a, b = ({SIM_MPS_PIPE_ENV: str(pipe_dir(tmp_path, n, 50))} for n in "ab")
    [solo] = run_together(claim, [(a, small)])
    pair = run_together(claim, [(a, small), (b, small)])
    sliced = run_together(claim, [({}, small), ({}, small)])  # the same pair, no MPS: time-sliced
    one = throughput(solo, SMALL_US)
    assert one > 0.9, solo  # alone, a small kernel runs at full speed within its 50 %
    together = sum(throughput(o, SMALL_US) for o in pair)
    assert together > 1.5 * one, (solo, pair)
    assert sum(throughput(o, SMALL_US) for o in sliced) < 1.1 * one, sliced


@CPU_TIMED
def test_large_kernels_split_by_share_and_lose_what_the_h100_lost(make_claim, tmp_path):
    claim = make_claim()
    large = ["--kernel-us", LARGE_US, *WHOLE]
    outs = run_together(claim, [({SIM_MPS_PIPE_ENV: str(pipe_dir(tmp_path, "a", 30))}, large),
                                ({SIM_MPS_PIPE_ENV: str(pipe_dir(tmp_path, "b", 70))}, large)])
    got = [throughput(o, LARGE_US) for o in outs]
    assert abs(100 * got[0] / sum(got) - 30) <= 3, outs  # the H100: 30.1 %
    assert 0.70 <= sum(got) <= 0.80, outs  # the H100: the pair did 75 % of solo


@pytest.mark.parametrize(("own", "expected"), [("100", 0.30 * HELD), ("10", 0.10 * HELD), (None, 0.30 * HELD)])
@CPU_TIMED
def test_a_client_env_can_lower_its_share_but_not_raise_it(make_claim, tmp_path, own, expected):
    claim = make_claim()
    env = {SIM_MPS_PIPE_ENV: str(pipe_dir(tmp_path, "a", 30))}
    if own is not None:
        env[SIM_MPS_THREADS_ENV] = own
    [out] = run_together(claim, [(env, ["--kernel-us", 200, *WHOLE])])  # short: 1024 queued drain soon at 10 %
    assert abs(throughput(out, 200) - expected) <= 0.03, out  # MPS partitions: alone, no more


def test_a_bad_server_file_is_named_and_the_client_runs_without_mps(make_claim, tmp_path):
    claim = make_claim()
    d = pipe_dir(tmp_path, "a", 30)
    (d / SIM_MPS_FILE).write_text(sim_mps_server_text("gpu0", 30).replace("=30", "=300"))
    p = claim.run("gpushare-probe", "launch", "--seconds", 0.3, "--kernel-us", LARGE_US,
                  env={SIM_MPS_PIPE_ENV: str(d), SIM_MPS_THREADS_ENV: "x"})
    assert f"{d / SIM_MPS_FILE} line 3: bad GPUSHARE_SIM_MPS_ACTIVE_THREAD_PERCENTAGE=300" in p.stderr
    assert p.stderr.count("gpushare-sim:") == 1, p.stderr  # not a client: its own variable is not read
    assert throughput(kv(p.stdout), LARGE_US) > 0.9, p.stdout  # a plain context, the whole GPU


def test_a_directory_without_a_server_is_no_mps(make_claim, tmp_path):
    """As a real client that reaches no control daemon: it runs as a plain context."""
    claim = make_claim()
    empty = tmp_path / "no-server"
    empty.mkdir()
    p = claim.run("gpushare-probe", "launch", "--seconds", 0.3, "--kernel-us", LARGE_US,
                  env={SIM_MPS_PIPE_ENV: str(empty), SIM_MPS_THREADS_ENV: "10"})
    assert p.stderr == "" and throughput(kv(p.stdout), LARGE_US) > 0.9, (p.stdout, p.stderr)


def set_compute_mode(claim, mode: int) -> None:
    """`nvidia-smi -c MODE` on GPU 0, through the simulated NVML, from a process of its own"""
    code = ("import ctypes, sys; n = ctypes.CDLL('libnvidia-ml.so.1'); d = ctypes.c_void_p(); "
            "assert n.nvmlInit_v2() == 0 and n.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(d)) == 0; "
            "sys.exit(n.nvmlDeviceSetComputeMode(d, int(sys.argv[1])))")
    subprocess.run([sys.executable, "-c", code, str(mode)], env=claim.env, check=True, timeout=60)


def test_exclusive_process_mode_admits_only_the_clients_of_one_server(make_claim, tmp_path):
    """With the GPU in EXCLUSIVE_PROCESS mode beside an MPS server (as NVIDIA advises), a tenant
    that drops or swaps its pipe directory gets no context, so no time slice beside the server."""
    claim = make_claim()
    set_compute_mode(claim, 3)
    client = {SIM_MPS_PIPE_ENV: str(pipe_dir(tmp_path, "a", 30))}
    holder = claim.popen("gpushare-probe", "alloc", "--chunk", "1Mi", "--max", "1Mi", "--hold", "30", env=client)
    try:
        assert holder.stdout.readline().startswith("step=0 rc=0"), holder.stderr.read()  # holds a context
        same = claim.run("gpushare-probe", "meminfo", env={SIM_MPS_PIPE_ENV: str(pipe_dir(tmp_path, "b", 70))})
        assert "cu_rc=0" in same.stdout
        for env in ({}, {SIM_MPS_PIPE_ENV: str(pipe_dir(tmp_path, "c", 100, server="gpu1"))}):
            p = claim.run("gpushare-probe", "meminfo", env=env, check=False)
            assert p.returncode == 2 and "error=CUDA_ERROR_DEVICE_UNAVAILABLE rc=46" in p.stdout, (env, p.stdout)
    finally:
        holder.kill()
        holder.communicate()
    assert "cu_rc=0" in claim.run("gpushare-probe", "meminfo").stdout  # the holder gone, one process may


@CPU_TIMED
def test_an_mps_claims_processes_are_held_to_its_share_in_sm_time(make_claim, tmp_path):
    """An MPS claim's limits file keeps its 25 % share and the GPU's SM count; the library books
    each launch's GPU time times the SMs the driver says its context may use. A client the server
    holds to 25 % (34 of 132 SMs, one TPC of rounding) books its own rate and is never held back;
    a plain context (no pipe folder) costs the whole GPU and gets 25 % of the time; a client of a
    server with a 50 % ceiling gets half the time on half the SMs; two clients of the claim share
    the 25 %; without the SM count every launch costs the whole GPU. One stderr line says why."""
    claim = make_claim(compute=25)
    with open(claim.limits, "a") as f:
        f.write("GPUSHARE_SHARING_STRATEGY=MPS\nGPUSHARE_SM_COUNT_0=132\n")
    quarter, half = (str(pipe_dir(tmp_path, f"at{p}", p, server=f"s{p}")) for p in (25, 50))
    large = ["--kernel-us", LARGE_US, *WHOLE]

    def together(*envs: dict) -> tuple[list[float], str]:
        outs, said = [], []
        procs = [claim.popen("gpushare-probe", "launch", "--seconds", SECONDS, *large, env=env) for env in envs]
        for p in procs:
            stdout, stderr = p.communicate(timeout=120)
            assert p.returncode == 0, stderr
            outs.append(throughput(kv(stdout), LARGE_US))
            said += [ln for ln in stderr.splitlines() if "MPS claim" in ln]
        return outs, "\n".join(said)

    [held], said_held = together({SIM_MPS_PIPE_ENV: quarter})
    [plain], said_plain = together({})
    [ceiling], _ = together({SIM_MPS_PIPE_ENV: half})
    pair, _ = together({SIM_MPS_PIPE_ENV: quarter}, {SIM_MPS_PIPE_ENV: quarter})
    claim.limits.write_text(claim.limits.read_text().replace("GPUSHARE_SM_COUNT_0=132\n", ""))
    [unknown], said_unknown = together({SIM_MPS_PIPE_ENV: quarter})
    print(f"held by the server {held:.2f}, plain context {plain:.2f}, 50 % server {ceiling:.2f}, "
          f"two clients {pair[0]:.2f} + {pair[1]:.2f}, SM count unknown {unknown:.2f}")
    # a client held to fewer SMs than its grid asks does HELD of its share's work, as on the H100
    assert abs(held - 0.25 * HELD) <= 0.03 and abs(plain - 0.25) <= 0.04 and abs(ceiling - 0.25 * HELD) <= 0.04
    assert abs(sum(pair) - 0.25 * HELD) <= 0.04
    assert unknown < 0.1  # 25 % of the time on 25 % of the SMs
    # a plain context answers all the SMs (the H200 did), and the library says why it is paced
    assert said_held == "" and "has all 132 SMs (no MPS client" in said_plain
    assert "does not give the GPU's SM count" in said_unknown
