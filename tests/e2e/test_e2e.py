"""End to end: a claim allocated, prepared and enforced in containers.

The emulator, the kubelet plugin with its slice controller on mock GPUs, the allocation
stand-in, the simulated driver and libgpushare.so, and podman + runc as the CDI consumer:
the scenario of `gpushare-dra demo` (playground/demo.py), where every step is a check.
Two pods of two containers share one 4Gi / 30 % claim and together cannot pass 4Gi; each
sees 4Gi total; a second claim on the same GPU keeps its own budget; a plugin restart
between pod starts keeps the shared budget; Unprepare leaves no file behind.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from playground.containers import OWNER_LABEL, PodmanRunner
from playground.node import DEVICE_CLASS, EXTENDED_DEVICE_CLASSES, MIG_DEVICE_CLASS, MPS_DEVICE_CLASS

ROOT = Path(__file__).parents[2]


def run_demo(tmp_path, runtime: str, *flags: str, steps: int = 14) -> str:
    """`gpushare-dra demo` as a user runs it: its own process (a plugin owns its process's NVML)."""
    out = subprocess.run([sys.executable, "-m", "dra_driver.cli", "demo", "--runtime", runtime,
                          "--workdir", str(tmp_path), *flags], capture_output=True, text=True, timeout=600)
    report = out.stdout[-6000:] + out.stderr[-3000:]
    assert out.returncode == 0, report
    assert f"[{steps}/{steps}]" in out.stdout and "Every step behaved" in out.stdout, report
    assert "      FAIL " not in out.stdout, report
    # No figure is a raw float (1.195731807) rather than a human unit.
    assert not re.search(r"\d\.\d{3,}", out.stdout), re.search(r".*\d\.\d{3,}.*", out.stdout).group(0)
    if not flags:  # step 13's two tables agree
        assert "ok   the tables agree" in out.stdout, report
    return out.stdout


@pytest.mark.podman
def test_story_in_podman_containers(tmp_path):
    why_not = PodmanRunner.available()
    if why_not:
        pytest.skip(f"podman runner unavailable: {why_not} (CI installs podman and runc and runs as root)")
    out = run_demo(tmp_path, "podman")
    assert "containers run with: podman" in out
    # this demo's containers only (a playground or another test may run podman on this host too)
    left = subprocess.run(["podman", "ps", "-aq", "--filter", f"label={OWNER_LABEL}={tmp_path}"], capture_output=True,
                          text=True, check=True).stdout.split()
    assert not left, f"containers left running: {left}"


def test_story_with_the_spec_applied_to_host_processes(tmp_path):
    """The same story without a container runtime: the demo's fallback must hold too."""
    out = run_demo(tmp_path, "process")
    assert "containers run with: process" in out
    assert "ok   NVML MEM per claim = its MEM USED" in out


def test_strategies_side_by_side_with_the_spec_applied_to_host_processes(tmp_path):
    """`demo --strategies`: one claim of each sharing strategy on one GPU, what each held."""
    out = run_demo(tmp_path, "process", "--strategies", steps=8)
    for row in (r"timeslicing\s+2\d\.\d%\s+\d+ us\s+yes\s+oom, holds 768Mi\s+1Gi",
                r"mps\s+\d+\.\d%\s+\d+ us\s+yes\s+oom, holds 768Mi\s+1Gi",
                r"none\s+\d+\.\d%\s+\d+ us\s+no\s+rc=0, 1536Mi in all\s+-"):
        assert re.search(row, out), out
    assert "ok   SHARING names each claim's strategy" in out
    if os.geteuid() == 0:  # its host processes run in their pods' cgroups: the backstop finds None's
        assert "ok   none: the backstop killed the container that held more than the budget" in out
        assert "ok   none: a Warning Event on the claim says so" in out
    else:
        assert "host processes outside one cannot be told apart" in out


@pytest.mark.podman
def test_strategies_side_by_side_in_podman_containers(tmp_path):
    why_not = PodmanRunner.available()
    if why_not:
        pytest.skip(f"podman runner unavailable: {why_not} (CI installs podman and runc and runs as root)")
    out = run_demo(tmp_path, "podman", "--strategies", steps=8)
    assert "containers run with: podman" in out
    assert "ok   mps: an MPS client of the GPU's server" in out
    assert "ok   none: the backstop killed the container that held more than the budget" in out


def test_demo_device_class_is_the_shipped_one():
    import yaml

    shipped = yaml.safe_load((ROOT / "deploy/base/deviceclass.yaml").read_text())
    assert shipped["spec"]["selectors"] == DEVICE_CLASS["spec"]["selectors"]
    assert shipped["metadata"]["name"] == DEVICE_CLASS["metadata"]["name"]


def test_playground_mps_class_is_the_shipped_one():
    import yaml

    assert yaml.safe_load((ROOT / "deploy/base/deviceclass-mps.yaml").read_text()) == MPS_DEVICE_CLASS


def test_playground_mig_class_is_the_shipped_one():
    import yaml

    assert yaml.safe_load((ROOT / "deploy/base/deviceclass-mig.yaml").read_text()) == MIG_DEVICE_CLASS


def test_playground_extended_resource_classes_are_the_shipped_ones():
    import yaml

    shipped = [d for d in yaml.safe_load_all((ROOT / "deploy/base/deviceclass-extended.yaml").read_text()) if d]
    assert shipped == EXTENDED_DEVICE_CLASSES
