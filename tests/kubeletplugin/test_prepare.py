"""Prepare / Unprepare over the real gRPC sockets against the API emulator."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes import client

from dra_driver.discovery import sim_uuid
from kubeletplugin.cdispec import KIND
from kubeletplugin.claimref import ClaimRef
from playground.claims import DRIVER, NAMESPACE, NODE, gpushare_config, make_claim, opaque_config, result
from playground.kubelet import Kubelet
from tests.support import GiB
from tests.support.cdi import load_spec, spec_path


def env_of(spec):
    return dict(e.split("=", 1) for e in spec["containerEdits"]["env"])


def limits_of(dirs, uid):
    with open(os.path.join(dirs.state, "claims", uid, "limits")) as f:
        return dict(line.split("=", 1) for line in f.read().splitlines() if line and not line.startswith("#"))


def test_registration(kubelet, dirs, plugin):
    info = kubelet.get_info()
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == dirs.dra_socket and os.path.isabs(info.endpoint)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
    kubelet.notify(False, "version mismatch")
    assert plugin.registration.registered is False
    kubelet.notify(True)
    assert plugin.registration.registered is True
    for sock in (dirs.dra_socket, dirs.reg_socket):
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600


def test_health(kubelet):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    reply = health_pb2_grpc.HealthStub(kubelet.dra).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_capacity_mode(api, kubelet, dirs):
    share = str(uuid.uuid4())
    claim = make_claim(api, [result("gpu-1", share_id=share, consumed={"memory": "4Gi", "compute": "30"})])
    uid = claim.uid
    answer = kubelet.prepare(claim).claims[uid]
    assert answer.error == ""
    (device,) = answer.devices
    assert (list(device.request_names), device.pool_name, device.device_name, device.share_id) == (
        ["gpu"], NODE, "gpu-1", share)
    assert list(device.cdi_device_ids) == [f"{KIND}={uid}-gpu-1-{share}"]
    spec = load_spec(dirs, uid)
    assert spec["kind"] == KIND
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-1-{share}"]
    env = env_of(spec)
    assert env["GPUSHARE_MEMORY_LIMIT_0"] == str(4 * GiB)
    assert env["GPUSHARE_COMPUTE_LIMIT_0"] == "30"
    assert env["GPUSHARE_DEVICE_UUID_0"] == sim_uuid(1)
    assert env["GPUSHARE_CLAIM_UID"] == uid
    assert env["LD_PRELOAD"] == "/usr/local/gpushare/lib/libgpushare.so"
    mounts = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
    assert set(mounts) == {"/usr/local/gpushare/lib/libgpushare.so", "/etc/ld.so.preload", "/var/run/gpushare/limits",
                           "/var/run/gpushare/region/0", "/var/run/gpushare/control/0"}
    for path in ("/usr/local/gpushare/lib/libgpushare.so", "/etc/ld.so.preload", "/var/run/gpushare/limits",
                 "/var/run/gpushare/control/0"):
        assert "ro" in mounts[path]["options"]
    assert mounts["/var/run/gpushare/control/0"]["hostPath"] == os.path.join(dirs.state, "claims", uid, "control-0")
    assert "rw" in mounts["/var/run/gpushare/region/0"]["options"]
    limits = limits_of(dirs, uid)
    assert limits["GPUSHARE_MEMORY_LIMIT_0"] == str(4 * GiB) and limits["GPUSHARE_COMPUTE_LIMIT_0"] == "30"
    assert limits["GPUSHARE_LIMITS_VERSION"] == "1" and limits["GPUSHARE_GPU_COUNT"] == "1"
    claim_dir = os.path.join(dirs.state, "claims", uid)
    region = os.path.join(claim_dir, "region", "0")
    assert stat.S_IMODE(os.stat(claim_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.dirname(claim_dir)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(region).st_mode) == 0o666 and os.path.getsize(region) == 1 << 20
    assert stat.S_IMODE(os.stat(os.path.join(claim_dir, "limits")).st_mode) == 0o444
    with open(os.path.join(claim_dir, "ld.so.preload")) as f:
        assert f.read() == "/usr/local/gpushare/lib/libgpushare.so\n"
    with open(region, "rb") as f:
        assert f.read() == bytes(1 << 20)
    control = os.stat(os.path.join(claim_dir, "control-0"))  # the agent's, read-only for containers
    assert (stat.S_IMODE(control.st_mode), control.st_uid, control.st_size) == (0o644, os.geteuid(), 4096)
    with open(os.path.join(claim_dir, "control-0"), "rb") as f:
        assert f.read() == bytes(4096)
    assert sorted(os.listdir(claim_dir)) == ["control-0", "ld.so.preload", "limits", "prepared.json", "region"]
    assert os.listdir(os.path.join(claim_dir, "region")) == ["0"]


def test_capacity_mode_missing_consumed_capacity_is_whole_gpu(api, kubelet, dirs):
    claim = make_claim(api, [result("gpu-0")])
    assert kubelet.prepare(claim).claims[claim.uid].error == ""
    env = env_of(load_spec(dirs, claim.uid))
    assert (env["GPUSHARE_MEMORY_LIMIT_0"], env["GPUSHARE_COMPUTE_LIMIT_0"]) == (str(16 * GiB), "100")


def test_partition_mode(api, kubelet, dirs):
    # --partitions 4 on 16Gi GPUs: each share is 4Gi and 25%.
    claim = make_claim(api, [result("gpu-2-share-0"), result("gpu-2-share-3")])
    answer = kubelet.prepare(claim).claims[claim.uid]
    assert answer.error == ""
    assert [d.device_name for d in answer.devices] == ["gpu-2-share-0", "gpu-2-share-3"]
    assert not answer.devices[0].HasField("share_id")
    env = env_of(load_spec(dirs, claim.uid))
    assert (env["GPUSHARE_MEMORY_LIMIT_0"], env["GPUSHARE_COMPUTE_LIMIT_0"]) == (str(8 * GiB), "50")
    assert env["GPUSHARE_DEVICE_UUID_0"] == sim_uuid(2)
    assert "GPUSHARE_MEMORY_LIMIT_1" not in env


def test_multi_gpu_claim_orders_gpus_by_index(api, kubelet, dirs):
    claim = make_claim(api, [result("gpu-3", request="a", share_id=str(uuid.uuid4()),
                                    consumed={"memory": "2Gi", "compute": "10"}),
                             result("gpu-1-share-1", request="b")])
    answer = kubelet.prepare(claim).claims[claim.uid]
    assert answer.error == ""
    env = env_of(load_spec(dirs, claim.uid))
    assert env["GPUSHARE_DEVICE_UUID_0"] == sim_uuid(1) and env["GPUSHARE_MEMORY_LIMIT_0"] == str(4 * GiB)
    assert env["GPUSHARE_DEVICE_UUID_1"] == sim_uuid(3) and env["GPUSHARE_COMPUTE_LIMIT_1"] == "10"
    assert os.path.getsize(os.path.join(dirs.state, "claims", claim.uid, "region", "1")) == 1 << 20
    assert os.path.getsize(os.path.join(dirs.state, "claims", claim.uid, "control-1")) == 4096
    assert len(load_spec(dirs, claim.uid)["devices"]) == 2


def test_shared_claim_second_prepare_is_identical_and_keeps_region(api, kubelet, dirs):
    claim = make_claim(api, [result("gpu-0", share_id=str(uuid.uuid4()), consumed={"memory": "1Gi", "compute": "5"})])
    first = kubelet.prepare(claim)
    # a running container's usage, and the agent's rate
    files = {name: os.path.join(dirs.state, "claims", claim.uid, name) for name in ("region/0", "control-0")}
    for path in files.values():
        with open(path, "r+b") as f:
            f.write(b"in use")
    before = {name: os.stat(path) for name, path in files.items()}
    spec_before = os.stat(spec_path(dirs, claim.uid))
    second = kubelet.prepare(claim)
    assert second == first
    for name, path in files.items():
        after = os.stat(path)
        assert (after.st_mtime_ns, after.st_ino) == (before[name].st_mtime_ns, before[name].st_ino), name
        with open(path, "rb") as f:
            assert f.read(6) == b"in use", name
    assert os.stat(spec_path(dirs, claim.uid)).st_mtime_ns == spec_before.st_mtime_ns


def test_configs_lower_but_never_raise(api, kubelet, dirs):
    share = str(uuid.uuid4())
    claim = make_claim(
        api, [result("gpu-0", request="a", share_id=share, consumed={"memory": "8Gi", "compute": "50"}),
              result("gpu-1-share-0", request="b")],
        config=[opaque_config(gpushare_config(memoryLimit="2Gi", computeLimit=90), requests=["a"]),
                opaque_config(gpushare_config(computeLimit=20), source="FromClass"),
                opaque_config({"whatever": True}, driver="other.example.com")])
    assert kubelet.prepare(claim).claims[claim.uid].error == ""
    env = env_of(load_spec(dirs, claim.uid))
    assert (env["GPUSHARE_MEMORY_LIMIT_0"], env["GPUSHARE_COMPUTE_LIMIT_0"]) == (str(2 * GiB), "20")
    assert (env["GPUSHARE_MEMORY_LIMIT_1"], env["GPUSHARE_COMPUTE_LIMIT_1"]) == (str(4 * GiB), "20")


def test_failures_are_per_claim(api, kubelet, dirs):
    good = make_claim(api, [result("gpu-0-share-0")])
    bad_config = make_claim(api, [result("gpu-0-share-1")], config=[opaque_config(gpushare_config(computeLimit=250))])
    other_driver = make_claim(api, [result("gpu-0", driver="other.example.com")])
    other_node = make_claim(api, [result("gpu-0", pool="node-b")])
    unallocated = make_claim(api, None)
    recreated = make_claim(api, [result("gpu-0-share-2")])
    client.ResourceV1Api(api).delete_namespaced_resource_claim(recreated.name, NAMESPACE)
    fresh = make_claim(api, [result("gpu-0-share-2")], name=recreated.name)
    missing = ClaimRef(NAMESPACE, "no-such-claim", str(uuid.uuid4()))
    bad_device = make_claim(api, [result("gpu-9")])
    response = kubelet.prepare(good, bad_config, other_driver, other_node, unallocated, recreated, missing, bad_device)
    errors = {uid: response.claims[uid].error for uid in response.claims}
    assert len(errors) == 8
    assert errors[good.uid] == ""
    assert "computeLimit" in errors[bad_config.uid] and "250" in errors[bad_config.uid]
    assert "no device of driver 'gpushare.dev'" in errors[other_driver.uid]
    assert "pool 'node-a'" in errors[other_node.uid]
    assert "not allocated" in errors[unallocated.uid]
    assert "metadata.uid" in errors[recreated.uid] and fresh.uid in errors[recreated.uid]
    assert "not found" in errors[missing.uid]
    assert "gpu-9" in errors[bad_device.uid]
    assert sorted(os.listdir(os.path.join(dirs.state, "claims"))) == [good.uid]
    assert os.listdir(dirs.cdi) == [os.path.basename(spec_path(dirs, good.uid))]


def test_unprepare_and_repeat(api, kubelet, dirs, plugin):
    claim = make_claim(api, [result("gpu-0-share-0")])
    kubelet.prepare(claim)
    for _ in range(2):
        assert kubelet.unprepare(claim).claims[claim.uid].error == ""
        assert not os.path.exists(spec_path(dirs, claim.uid))
        assert not os.path.exists(os.path.join(dirs.state, "claims", claim.uid))
        assert plugin.driver.checkpoint.get(claim.uid) is None
    unknown = ClaimRef(NAMESPACE, "never-seen", str(uuid.uuid4()))
    assert kubelet.unprepare(unknown).claims[unknown.uid].error == ""
    # Prepared again after an unprepare: fresh state.
    assert kubelet.prepare(claim).claims[claim.uid].error == ""
    assert os.path.exists(spec_path(dirs, claim.uid))


def test_v1beta1_service(api, kubelet, dirs):
    claim = make_claim(api, [result("gpu-1-share-1")])
    answer = kubelet.prepare(claim, version="v1beta1").claims[claim.uid]
    assert answer.error == ""
    assert list(answer.devices[0].cdi_device_ids) == [f"{KIND}={claim.uid}-gpu-1-share-1"]
    # The same claim through v1 gets the same devices.
    assert kubelet.prepare(claim).claims[claim.uid].devices[0].device_name == "gpu-1-share-1"
    assert kubelet.unprepare(claim, version="v1beta1").claims[claim.uid].error == ""
    assert not os.path.exists(spec_path(dirs, claim.uid))


def test_64_claims_in_parallel(api, kubelet, dirs, plugin):
    claims = [make_claim(api, [result(f"gpu-{n % 4}", share_id=str(uuid.uuid4()),
                                      consumed={"memory": "1Gi", "compute": "1"})])
              for n in range(64)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda c: kubelet.prepare(c).claims[c.uid], claims))
    assert all(a.error == "" and len(a.devices) == 1 for a in answers)
    assert len(os.listdir(dirs.cdi)) == 64
    assert len(plugin.driver.prepared_claims()) == 64
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda c: kubelet.unprepare(c).claims[c.uid], claims))
    assert all(a.error == "" for a in answers)
    assert os.listdir(dirs.cdi) == [] and os.listdir(os.path.join(dirs.state, "claims")) == []
    assert plugin.driver.checkpoint.items() == []


def test_same_claim_concurrently_prepares_once(api, kubelet, dirs):
    claim = make_claim(api, [result("gpu-0-share-0")])
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: kubelet.prepare(claim), range(8)))
    assert all(a == answers[0] for a in answers) and answers[0].claims[claim.uid].error == ""


@pytest.mark.parametrize("namespace,name,uid,field", [
    (NAMESPACE, "c", "../../etc/passwd", "uid"),
    (NAMESPACE, "c", "0f0f0f0f-0000-4000-8000-00000000000/", "uid"),
    (NAMESPACE, "c", "0f0f0f0f-0000-4000-8000-000000000000\x00", "uid"),
    (NAMESPACE, "c", "0F0F0F0F-0000-4000-8000-000000000000", "uid"),
    (NAMESPACE, "c", "a" * 5000, "uid"),
    ("../kube-system", "c", "0f0f0f0f-0000-4000-8000-000000000000", "namespace"),
    ("a" * 64, "c", "0f0f0f0f-0000-4000-8000-000000000000", "namespace"),
    (NAMESPACE, "../x", "0f0f0f0f-0000-4000-8000-000000000000", "name"),
    (NAMESPACE, "a/b", "0f0f0f0f-0000-4000-8000-000000000000", "name"),
    (NAMESPACE, "a" * 254, "0f0f0f0f-0000-4000-8000-000000000000", "name"),
    # exact match: `$` in a regex also matches before a trailing newline
    (NAMESPACE, "c", "0f0f0f0f-0000-4000-8000-000000000000\n", "uid"),
    (NAMESPACE + "\n", "c", "0f0f0f0f-0000-4000-8000-000000000000", "namespace"),
    (NAMESPACE, "c\n", "0f0f0f0f-0000-4000-8000-000000000000", "name"),
])
def test_path_safety(kubelet, dirs, namespace, name, uid, field):
    answer = kubelet.prepare(ClaimRef(namespace, name, uid)).claims[uid]
    assert field in answer.error
    assert os.listdir(dirs.cdi) == [] and os.listdir(os.path.join(dirs.state, "claims")) == []
    if field == "uid":
        assert "uid" in kubelet.unprepare(ClaimRef(namespace, name, uid)).claims[uid].error
    assert sorted(os.listdir(dirs.root)) == ["cdi", "plugin", "registry", "state"]


@pytest.mark.parametrize("share_id", ["x" * 10, "0f0f0f0f-0000-4000-8000-000000000000\n"])
def test_bad_share_id_is_rejected(api, kubelet, dirs, share_id):
    claim = make_claim(api, [result("gpu-0", share_id=share_id)])
    answer = kubelet.prepare(claim).claims[claim.uid]
    assert "shareID" in answer.error and repr(share_id)[1:-1] in answer.error


def test_nvidia_toolkit_spec_is_used(api, kubelet, dirs):
    os.makedirs(dirs.cdi, exist_ok=True)
    with open(os.path.join(dirs.cdi, "nvidia.yaml"), "w") as f:
        f.write(f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '{sim_uuid(2)}'\n  containerEdits: {{}}\n"
                "- name: all\n  containerEdits: {}\n")
    claim = make_claim(api, [result("gpu-2-share-0", request="a"), result("gpu-3-share-0", request="b")])
    answer = kubelet.prepare(claim).claims[claim.uid]
    assert [list(d.cdi_device_ids)[1:] for d in answer.devices] == [
        [f"nvidia.com/gpu={sim_uuid(2)}"], ["nvidia.com/gpu=all"]]
    assert "deviceNodes" not in load_spec(dirs, claim.uid)["containerEdits"]


def test_metrics_and_slices(api, start_plugin, dirs):
    import urllib.request

    plugin = start_plugin(metrics_addr="127.0.0.1:0", publish_slices=True, sharing_mode="partition")
    assert plugin.slices is not None and plugin.slices.wait_synced(20)
    slices = client.ResourceV1Api(api).list_resource_slice(field_selector=f"spec.nodeName={NODE}").items
    assert any(s.spec.driver == DRIVER for s in slices)
    kubelet_claim = make_claim(api, [result("gpu-0-share-0")])

    k = Kubelet(dirs.dra_socket, dirs.reg_socket)
    assert k.prepare(kubelet_claim).claims[kubelet_claim.uid].error == ""
    k.close()
    body = urllib.request.urlopen(f"http://127.0.0.1:{plugin.metrics_port}/metrics", timeout=5).read().decode()
    assert 'gpushare_kubelet_plugin_claims_total{operation="prepare",result="success"} 1.0' in body


def test_liveness_on_tcp_for_the_kubelet_probe(start_plugin):
    """The DaemonSet's livenessProbe (grpc, service "liveness") reaches the plugin over TCP."""
    import socket

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_plugin(healthcheck_port=port)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=5)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_mock_nodes_give_containers_the_simulated_driver(api, start_plugin, dirs, hook_dir):
    """With sim/ beside the library, every container of a mock node gets libcuda.so.1 and one shared sim state."""
    sim = os.path.join(hook_dir, "sim")
    os.makedirs(sim, exist_ok=True)
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        open(os.path.join(sim, name), "ab").close()
    try:
        start_plugin()
        k = Kubelet(dirs.dra_socket, dirs.reg_socket)
        claim = make_claim(api, [result("gpu-1-share-0")])
        assert k.prepare(claim).claims[claim.uid].error == ""
        k.close()
    finally:  # the hook dir is the session's: empty libraries left there would reach later plugins
        shutil.rmtree(sim)
    edits = load_spec(dirs, claim.uid)["containerEdits"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts["/usr/local/gpushare/sim/libcuda.so.1"] == os.path.join(hook_dir, "sim", "libcuda.so.1")
    assert mounts["/usr/local/gpushare/sim/libnvidia-ml.so.1"] == os.path.join(hook_dir, "sim", "libnvidia-ml.so.1")
    state = mounts["/var/run/gpushare/sim.state"]
    assert state == os.path.join(dirs.state, "sim.state") and os.stat(state).st_mode & 0o777 == 0o666
    assert {"LD_LIBRARY_PATH=/usr/local/gpushare/sim", "GPUSHARE_SIM_STATE=/var/run/gpushare/sim.state",
            "GPUSHARE_SIM_DEVICES=4", f"GPUSHARE_SIM_MEMORY={16 << 30}"} <= set(edits["env"])


def test_real_library_path_is_resolved_through_the_install_symlink(api, start_plugin, dirs, hook_dir):
    """install-hook's libgpushare.so is a symlink; specs name the versioned file it points at."""
    versioned = os.path.join(hook_dir, "libgpushare-0123456789ab.so")
    os.rename(os.path.join(hook_dir, "libgpushare.so"), versioned)
    os.symlink(os.path.basename(versioned), os.path.join(hook_dir, "libgpushare.so"))
    start_plugin()
    k = Kubelet(dirs.dra_socket, dirs.reg_socket)
    claim = make_claim(api, [result("gpu-0-share-0")])
    assert k.prepare(claim).claims[claim.uid].error == ""
    k.close()
    mounts = {m["containerPath"]: m["hostPath"] for m in load_spec(dirs, claim.uid)["containerEdits"]["mounts"]}
    assert mounts["/usr/local/gpushare/lib/libgpushare.so"] == versioned


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another host user needs root")
def test_other_host_users_cannot_open_a_region(api, kubelet, dirs):
    """The region file is 0666 (any container UID maps it through its mount), but its 0700
    folder keeps every other host user from reaching it by path."""
    claim = make_claim(api, [result("gpu-0-share-3")])
    assert kubelet.prepare(claim).claims[claim.uid].error == ""
    os.chmod(dirs.root, 0o755)  # the test's own temporary folder must not be what stops them
    region = os.path.join(dirs.state, "claims", claim.uid, "region", "0")
    # setpriv, not subprocess's user=: that makes Python fork() rather than vfork(), and the fork
    # runs gRPC's atfork handlers in the child (this process serves gRPC), which crashed it once
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           "sh", "-c", f"echo forged 1<> {region}"], capture_output=True, text=True)
    assert proc.returncode != 0 and "Permission denied" in proc.stderr, proc
    with open(region, "rb") as f:
        assert f.read(6) == bytes(6)


def test_first_available_subrequest_is_prepared_with_its_limits_and_reported_by_its_request(api, kubelet, dirs):
    """A firstAvailable claim allocated to its second subrequest: the device gets that
    subrequest's capacity as limits, and the kubelet hears the request's name, `gpu` (as the
    kubelet plugin helper strips `/share-10gi`: a container names `request: gpu`)."""
    def sub(name, memory):
        return {"name": name, "deviceClassName": DRIVER,
                "capacity": {"requests": {"memory": memory, "compute": "20"}}}

    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "fallback"},
            "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                sub("share-20gi", "20Gi"), sub("share-10gi", "10Gi")]}]}}}
    rapi = client.ResourceV1Api(api)
    created = rapi.create_namespaced_resource_claim(NAMESPACE, body)
    share = str(uuid.uuid4())
    allocated = result("gpu-0", request="gpu/share-10gi", share_id=share, consumed={"memory": "10Gi", "compute": "20"})
    rapi.patch_namespaced_resource_claim_status("fallback", NAMESPACE, {"status": {"allocation": {"devices": {
        "results": [allocated], "config": [opaque_config(gpushare_config(computeLimit=15), requests=["gpu"])]}}}})
    claim = ClaimRef(NAMESPACE, "fallback", created.metadata.uid)
    answer = kubelet.prepare(claim).claims[claim.uid]
    assert answer.error == ""
    (device,) = answer.devices
    assert (list(device.request_names), device.device_name) == (["gpu"], "gpu-0")
    env = env_of(load_spec(dirs, claim.uid))
    # the subrequest's capacity, lowered by the config that names its request
    assert (env["GPUSHARE_MEMORY_LIMIT_0"], env["GPUSHARE_COMPUTE_LIMIT_0"]) == (str(10 * GiB), "15")
    assert kubelet.unprepare(claim).claims[claim.uid].error == ""
