"""KEP-4680 on the playground: an XID on a simulated GPU shows in the status of the pod using it.

The playground runs as its own process, as a user starts it (tests/support/playground.py; in this
process it would load the simulated NVML on another state file than the agent tests' node, and the
simulated NVML is loaded once per process), containers as host processes. The XID goes where the
simulated NVML reads its events (docs/operations.md, GPU health); the plugin's health stream carries it to the node's
kubelet, which writes `status.containerStatuses[].allocatedResourcesStatus` as the kubelet does.
"""

import json
import os

import pytest

from dra_driver.devicemodel import cdi_device_name
from tests.support.kubectl import needs_kubectl
from tests.support.playground import playground, wait_for


@pytest.fixture
def cluster(tmp_path):
    with playground(tmp_path, "--health-recovery-seconds", "2") as started:
        yield started


def claim(name):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpushare.dev", "capacity": {"requests": {"memory": "4Gi"}}}}]}}}


def pod(name, claim_name):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"resourceClaims": [{"name": "share", "resourceClaimName": claim_name}],
                     "containers": [
                         {"name": "main", "image": "x", "command": ["sleep", "120"],
                          "resources": {"claims": [{"name": "share", "request": "gpu"}]}},
                         {"name": "side", "image": "x", "command": ["sleep", "120"]}]}}


def health_of(kubectl, name):
    """{container: allocatedResourcesStatus} once the pod runs, else None."""
    status = json.loads(kubectl("get", "pod", name, "-o", "json"))["status"]
    if status.get("phase") != "Running":
        return None
    return {c["name"]: c.get("allocatedResourcesStatus") for c in status.get("containerStatuses") or []}


@needs_kubectl
def test_xid_shows_unhealthy_in_pod_status_then_healthy(cluster):
    kubectl, node_dir = cluster
    for obj in (claim("c1"), pod("p1", "c1")):
        kubectl("apply", "-f", "-", input=json.dumps(obj))

    healthy = wait_for("p1 running with a Healthy device", lambda: (h := health_of(kubectl, "p1")) and h["main"] and
                       h["main"][0]["resources"][0]["health"] == "Healthy" and h)
    c1 = json.loads(kubectl("get", "resourceclaim", "c1", "-o", "json"))
    result = c1["status"]["allocation"]["devices"]["results"][0]
    device = result["device"]  # gpu-<i>: capacity mode on 1.37
    resource_id = f"k8s.gpushare.dev/claim={cdi_device_name(c1['metadata']['uid'], device, result.get('shareID'))}"
    assert healthy == {"main": [{"name": "claim:share/gpu", "resources": [
        {"resourceID": resource_id, "health": "Healthy"}]}],
        "side": None}  # a container that names no claim gets none

    gpu = device.split("-")[1]
    with open(os.path.join(node_dir, "state", "sim.state.events"), "a") as f:
        f.write(f"{gpu} xid 79\n")
    wait_for("the device Unhealthy in p1's status",
             lambda: (health_of(kubectl, "p1") or {}).get("main", [{}])[0].get("resources", [{}])[0].get("health")
             == "Unhealthy")
    # no further event for 2 s (--health-recovery-seconds): healthy again
    wait_for("the device Healthy again in p1's status",
             lambda: (health_of(kubectl, "p1") or {}).get("main", [{}])[0].get("resources", [{}])[0].get("health")
             == "Healthy")
