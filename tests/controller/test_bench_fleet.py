"""hack/bench-fleet at its smallest: the real control plane of the pinned build (etcd, kube-apiserver,
the resourceclaim controller, kube-scheduler on ports and a folder of their own), one kubelet-less
node published by the product's controller, pods with claims placed by the real scheduler, and the
fleet filled to the first failure. The harness's figures are the bench's (docs/fleet.md); this
checks that it measures what it says."""

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
    proc = subprocess.run([sys.executable, BENCH, "--nodes", "1", "--pods", "6", "--fill-nodes", "1",
                           "--modes", "capacity", "--limit", "120"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp_path)})  # its control plane's folder
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # The controller published the node; all 6 pods were bound by the scheduler.
    assert re.search(r"^1\s+capacity\s+[0-9.]+ s\s+[0-9.]+ ms\s+[0-9.]+\s+.*POST", out, re.M), out
    assert re.search(r"^1\s+capacity\s+6/6\s+[0-9.]+\s", out, re.M), out
    # Filled until the first claim failed, under both scorings: 8 GPUs hold the mix to >= 90 %.
    fills = re.findall(r"^1\s+capacity\s+(binpack|spread)\s+(\d+)\s+fill-\d+ \(\w+\)\s+([0-9.]+)%", out, re.M)
    assert [f[0] for f in fills] == ["binpack", "spread"], out
    assert all(int(placed) > 8 and float(memory) >= 50 for _, placed, memory in fills), fills
    assert not list(tmp_path.glob("bench-fleet-*"))  # its folder removed (its processes ended first)
