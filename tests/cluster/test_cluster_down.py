"""hack/cluster-down removes what hack/cluster-up made, and nothing else, on this folder's real
cluster. It runs after every other test here (tests/cluster/conftest.py ORDER): it takes the
cluster down.

Before cluster-up the fixture noted the host's traces of a cluster (tests/support/cluster.py
host_traces) and planted other software (tests/support/neighbours.py): in each CDI folder another
vendor's spec and a day-old gpushare spec of another run (its own state dir), and a process in a kubepods cgroup
of another kubelet. Here a pod runs, the cluster's plugin has a spec in place and another vendor
writes a spec while the cluster runs; then cluster-down: every planted thing is there unchanged,
and the host shows nothing of the cluster (cgroups, lo addresses, routes, links, /var/lib/cni,
mounts, network namespaces, CDI specs, folders) that it did not show before cluster-up.
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from cdi import ContainerEdits, Device, Mount, Spec, SpecDir
from kubeletplugin.cdispec import KIND
from tests.support.cluster import DOWN, PLUGIN_STATE, host_traces

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

POD = """
apiVersion: v1
kind: Pod
metadata: {name: down-sleeper, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: gpushare-dra:dev
    command: ["sleep", "infinity"]
"""


def test_cluster_down_removes_what_the_cluster_made_and_nothing_else(cluster):
    kube = cluster
    if os.environ.get("GPUSHARE_CLUSTER_KEEP"):
        pytest.skip("GPUSHARE_CLUSTER_KEEP=1: the cluster is kept running")
    if kube.before is None or kube.neighbours is None:
        pytest.skip("the cluster ran before these tests (or nothing could be planted): what the host had "
                    "before cluster-up is not known")
    kube.apply(POD)
    kube.wait_until("the pod to run", lambda: kube.get("pod", "down-sleeper")["status"].get("phase") == "Running")
    # A spec of the cluster's plugin, as its writer writes one: its kind, a claim's file in its state dir.
    uid = str(uuid.uuid4())
    ours = SpecDir("/var/run/cdi", KIND).write(uid, Spec(KIND, [Device(f"{uid}-gpu", ContainerEdits(
        env=[f"GPUSHARE_CLAIM_UID={uid}"]))], ContainerEdits(mounts=[Mount(
            f"{PLUGIN_STATE}/claims/{uid}/limits", "/var/run/gpushare/limits", ["ro", "bind"])])))
    for folder in ("/etc/cdi", "/var/run/cdi"):
        kube.neighbours.spec(folder)  # another vendor's, written while the cluster runs
    running = host_traces()
    assert ours in running["cdi specs"], running["cdi specs"]
    made = {kind for kind, found in running.items() if set(found) - set(kube.before[kind])}
    assert {"cgroups", "mounts", "/var/lib/cni", "links", "folders"} <= made, made  # the checks below can fail

    down = subprocess.run([str(DOWN)], capture_output=True, text=True, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr

    assert kube.neighbours.missing() == [], "cluster-down removed or ended other software's"
    after = host_traces()
    changed = {kind: {"left": sorted(set(after[kind]) - set(kube.before[kind])),
                      "gone": sorted(set(kube.before[kind]) - set(after[kind]))}
               for kind in after if set(after[kind]) != set(kube.before[kind])}
    assert changed == {}, "after cluster-down against before cluster-up"
