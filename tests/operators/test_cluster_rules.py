"""The rules by which hack/cluster-down tells the cluster's things from other software's
(hack/cluster/lib.sh), run from bash as cluster-down runs them, without a cluster: which CDI specs
are the cluster's plugin's, how recorded paths are written, where the kubelet's cgroups are.
tests/cluster/test_cluster_down.py checks the whole of cluster-down on the real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from tests.support import REPO


def lib(script: str, *args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"CLUSTER_STATE": str(state)} if state else {})}
    return subprocess.run(["bash", "-c", f'source "{REPO}/hack/cluster/lib.sh"; {script}', "lib", *args],
                          env=env, capture_output=True, text=True, timeout=30)


def spec(path: Path, kind: str, host_path: str, age_s: float = 0) -> Path:
    path.write_text(json.dumps({"cdiVersion": "0.6.0", "kind": kind, "devices": [{"name": "d", "containerEdits": {
        "env": ["A=1"]}}], "containerEdits": {"mounts": [{"hostPath": host_path, "containerPath": "/x"}]}}, indent=2))
    os.utime(path, (time.time() - age_s,) * 2)
    return path


def test_only_the_plugins_specs_of_its_state_dir_written_since_cluster_up_are_the_clusters(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "up-since").touch()
    os.utime(state / "up-since", (time.time() - 60,) * 2)
    ours = spec(tmp_path / "k8s.gpushare.dev-claim_1.json", "k8s.gpushare.dev/claim",
                "/var/lib/gpushare/claims/1/limits")
    others = {
        "another vendor's": spec(tmp_path / "example.com-gpu_a.json", "example.com/gpu", "/var/lib/gpushare/x"),
        "a podman run's gpushare spec (its own state dir)": spec(
            tmp_path / "k8s.gpushare.dev-claim_2.json", "k8s.gpushare.dev/claim", "/tmp/gskp1/claims/2/limits"),
        "an earlier cluster's (older than cluster-up)": spec(
            tmp_path / "k8s.gpushare.dev-claim_3.json", "k8s.gpushare.dev/claim", "/var/lib/gpushare/claims/3/limits",
            age_s=3600),
        "a kind that only starts like ours": spec(tmp_path / "k8s.gpushare.dev-claimx_4.json",
                                                  "k8s.gpushare.dev/claimx", "/var/lib/gpushare/claims/4/limits"),
    }
    assert lib('cluster_spec "$1"', str(ours), state=state).returncode == 0
    judged = {what: lib('cluster_spec "$1"', str(path), state=state).returncode for what, path in others.items()}
    assert judged == dict.fromkeys(others, 1)


def test_recorded_paths_are_written_one_way():
    """cluster-up recorded "$h/kubepods" from a glob ending in / (a double slash) and cluster-down
    compared it with paths that had none: the rule that kept what was there never matched."""
    out = lib('norm /sys/fs/cgroup/cpu//kubepods/; norm /var/lib/./gpushare').stdout.split()
    assert out == ["/sys/fs/cgroup/cpu/kubepods", "/var/lib/gpushare"]


def test_the_kubelets_cgroups_are_under_a_root_of_the_clusters_own_in_each_hierarchy():
    mounts = sorted({line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                     if line.split()[2] in ("cgroup", "cgroup2") and line.split()[1].startswith("/sys/fs/cgroup")})
    roots = lib("cgroup_roots").stdout.split()
    assert roots == sorted(os.path.realpath(f"{m}/gpushare-cluster") for m in mounts)
