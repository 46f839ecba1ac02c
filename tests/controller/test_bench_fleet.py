"""hack/bench-fleet at its smallest: the real control plane of the pinned build (etcd, kube-apiserver,
the resourceclaim controller, kube-scheduler on ports and a folder of their own), one kubelet-less
node of one GPU published by the product's controller, pods with claims placed by the real
scheduler, and the fleet filled to the first failure under binpack. The harness's figures are
the bench's (docs/fleet.md); this checks that it measures what it says."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support import REPO

BENCH = os.path.join(REPO, "hack", "bench-fleet")


def _why_not() -> str | None:
    if not glob.glob(os.path.join(REPO, ".cache/cluster/v*/bin/kube-scheduler")):
        return "the Kubernetes binaries are not built (hack/cluster/build; cold, about 40 minutes)"
    if not os.path.exists(os.path.join(REPO, ".cache/cluster/debs/usr/bin/etcd")):
        return "etcd is not unpacked (hack/cluster/debs)"
    if not shutil.which("openssl"):
        return "openssl not found"
    return None


def test_one_node_fleet_is_published_scheduled_and_filled(tmp_path):
    if why := _why_not():
        pytest.skip(why)
    # One node of one GPU, binpack only: the harness whole (the figures are the bench's), lean
    # enough for the suite (the control plane's start is most of it).
    proc = subprocess.run([sys.executable, BENCH, "--nodes", "1", "--gpus", "1", "--pods", "2", "--fill-nodes", "1",
                           "--scorings", "binpack", "--modes", "capacity", "--limit", "60"], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "TMPDIR": str(tmp_path)})  # its plane's folder
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # The controller published the node; both pods were bound by the scheduler.
    assert re.search(r"^1\s+capacity\s+[0-9.]+ s\s+[0-9.]+ ms\s+[0-9.]+\s+.*POST", out, re.M), out
    assert re.search(r"^1\s+capacity\s+2/2\s+[0-9.]+\s", out, re.M), out
    # Filled until the first claim failed: the GPU held several claims of the mix, and the memory
    # booked is what the placed claims asked (capacity mode books exactly the ask).
    [(placed, booked, asked)] = re.findall(
        r"^1\s+capacity\s+binpack\s+(\d+)\s+fill-\d+ \(\w+\)\s+([0-9.]+)%\s+[0-9.]+%\s+([0-9.]+)%", out, re.M)
    assert int(placed) > 1 and float(booked) >= 50 and booked == asked, out
    assert not list(tmp_path.glob("bench-fleet-*"))  # its folder removed (its processes ended first)
