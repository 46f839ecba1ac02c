"""KEP-4680 on the playground: an XID on a simulated GPU shows in the status of the pod using it.

The playground runs in this process (the emulator, the scheduler, the real kubelet plugin and the
node's kubelet), containers as host processes. The XID goes where the simulated NVML reads its
events (docs/operations.md, GPU health); the plugin's health stream carries it to the node's
kubelet, which writes `status.containerStatuses[].allocatedResourcesStatus` as the kubelet does.
"""

import os

import pytest
from kubernetes import client

from dra_driver.cli import build_parser
from dra_driver.devicemodel import cdi_device_name
from dra_driver.playground.cluster import Playground
from tests.support.playground import wait_for


@pytest.fixture
def playground(tmp_path):
    args = build_parser().parse_args(["playground", "--port", "0", "--runtime", "process", "--node-name", "node-h",
                                      "--mock-gpus", "2x80Gi", "--health-recovery-seconds", "2"])
    cluster = Playground(args, None, str(tmp_path))
    try:
        yield cluster, tmp_path
    finally:
        cluster.stop()


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


def health_of(core, name):
    """{container: allocatedResourcesStatus} once the pod runs, else None."""
    status = core.read_namespaced_pod(name, "default", _preload_content=False).json()["status"]
    if status.get("phase") != "Running":
        return None
    return {c["name"]: c.get("allocatedResourcesStatus") for c in status.get("containerStatuses") or []}


def test_xid_shows_unhealthy_in_pod_status_then_healthy(playground):
    cluster, workdir = playground
    api = cluster.emulator.api_client()
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    resource.create_namespaced_resource_claim("default", claim("c1"))
    core.create_namespaced_pod("default", pod("p1", "c1"))

    healthy = wait_for("p1 running with a Healthy device", lambda: (h := health_of(core, "p1")) and h["main"] and
                       h["main"][0]["resources"][0]["health"] == "Healthy" and h)
    c1 = resource.read_namespaced_resource_claim("c1", "default")
    result = c1.status.allocation.devices.results[0]
    device = result.device  # gpu-<i>: capacity mode on 1.37
    resource_id = f"k8s.gpushare.dev/claim={cdi_device_name(c1.metadata.uid, device, result.share_id)}"  # the CDI ID
    assert healthy == {"main": [{"name": "claim:share/gpu", "resources": [
        {"resourceID": resource_id, "health": "Healthy"}]}],
        "side": None}  # a container that names no claim gets none

    gpu = device.split("-")[1]
    with open(os.path.join(workdir, "state", "sim.state.events"), "a") as f:
        f.write(f"{gpu} xid 79\n")
    wait_for("the device Unhealthy in p1's status",
             lambda: (health_of(core, "p1") or {}).get("main", [{}])[0].get("resources", [{}])[0].get("health")
             == "Unhealthy")
    # no further event for 2 s (--health-recovery-seconds): healthy again
    wait_for("the device Healthy again in p1's status",
             lambda: (health_of(core, "p1") or {}).get("main", [{}])[0].get("resources", [{}])[0].get("health")
             == "Healthy")
