"""The product on a real Kubernetes (hack/cluster-up: kube-apiserver, kube-controller-manager,
kube-scheduler, a kubelet and containerd built or unpacked from their releases), checked the way a
user sees it, through kubectl. One cluster for the whole module (tests/cluster/conftest.py); the
tests run in file order and the last one uninstalls the product.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from dra_driver.hookpath import native_paths
from tests.support import GiB, roots
from tests.support.claimstatus import check_status_writer
from tests.support.cluster import claim_manifest, claim_template, cluster_specs

# The fixture's cold start (a Go build of five binaries on 2 cores) is part of the first test's time.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(5400)]

E2E = "e2e"
DRIVER = "gpushare.dev"


def allocated(kube, pod: str, container: str) -> int | None:
    """Bytes a probe container holds, from its `allocated=N chunks=M result=R` line."""
    for line in kube.logs(pod, container).splitlines():
        if line.startswith("allocated=") and " result=" in line:
            return int(line.split()[0].split("=")[1])
    return None


def pod_phase(kube, name: str, namespace: str = "default") -> str:
    return kube.get("pod", name, "-n", namespace)["status"].get("phase", "")


def node_shell(*args: str) -> str:
    """A command on the node: the node is this machine."""
    return subprocess.run(args, capture_output=True, text=True, check=False).stdout


def test_the_node_is_ready_the_plugin_runs_and_publishes_slices(installed):
    kube = installed
    assert kube.install is not None
    assert kube.install.returncode == 0, f"kubectl apply -k deploy/overlays/mock:\n{kube.install.stderr}"
    node = kube.get("node", kube.node)
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.37.")
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")
    pods = kube.items("pods", "-n", "gpushare-system", "-l", "app.kubernetes.io/name=gpushare-dra")
    # the DaemonSet's pod now: one an earlier test's rollout replaced may still be ending (handover)
    plugin = [p for p in pods if p["spec"].get("nodeName") == kube.node and not p["metadata"].get("deletionTimestamp")]
    assert plugin and plugin[0]["status"]["phase"] == "Running", [p["status"] for p in pods]
    assert all(cs["ready"] for cs in plugin[0]["status"]["containerStatuses"])
    slices = [s for s in kube.items("resourceslices") if s["spec"]["driver"] == DRIVER]
    devices = [d["name"] for s in slices if s["spec"].get("nodeName") == kube.node for d in s["spec"]["devices"]]
    assert len(devices) >= 2, slices  # --mock-gpus=2x80Gi
    # The plugin registered with the real kubelet's plugin manager: its socket is in the registry.
    assert "gpushare.dev" in node_shell("ls", "/var/lib/kubelet/plugins_registry")


def test_two_pods_of_one_claim_share_its_budget_allocated_by_the_real_scheduler(installed):
    kube = installed
    files = [f"deploy/examples/{E2E}/0{i}" for i in range(1, 5)]
    kube("delete", "-f", f"deploy/examples/{E2E}", "--ignore-not-found", "--wait=true", "--grace-period=1", timeout=180)
    try:
        kube("apply", "-f", f"{files[0]}-claims.yaml", "-f", f"{files[1]}-trainer-a.yaml",
             "-f", f"{files[2]}-trainer-b.yaml", "-f", f"{files[3]}-other-team.yaml")
        kube.wait_ready("trainer-a", "trainer-b", "other")
        # Allocated by the real scheduler's allocator, reserved for both pods, one device.
        claim = kube.get("resourceclaim", "shared-gpu")
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [r["driver"] for r in results] == [DRIVER]
        assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == ["trainer-a", "trainer-b"]
        assert kube.get("pod", "trainer-a")["spec"]["nodeName"] == kube.node

        def all_printed():
            got = {pc: allocated(kube, *pc.split("/")) for pc in
                   ("trainer-a/a1", "trainer-a/a2", "trainer-b/b1", "trainer-b/b2", "other/c1")}
            return got if None not in got.values() else None
        held = kube.wait_until("the probes' results", all_printed, timeout=90)
        shared = sum(v for k, v in held.items() if not k.startswith("other"))
        assert shared == 4 * GiB, held  # one budget of 4Gi for the four containers
        assert held["other/c1"] == 2 * GiB, held  # other-team: a budget of its own
        logs = kube("logs", "trainer-a", "--all-containers") + kube("logs", "trainer-b", "--all-containers")
        assert "result=oom" in logs  # the allocations past the budget failed with out-of-memory
        # CDI: containerd injected the claim's device (the hook and its limits) into the container.
        meminfo = kube("exec", "trainer-b", "-c", "b1", "--", "sh", "-c", '"$(gpushare-dra hook-path probe)" meminfo')
        assert f"cu_total={4 * GiB}" in meminfo, meminfo
        assert f"nvml_total={4 * GiB}" in meminfo, meminfo
        # The claim's usage region, the one file its containers write, is on the claim's own tmpfs
        # on the node (the plugin's Bidirectional state dir): no tenant grows it on the node's disk.
        region = f"/var/lib/gpushare/claims/{claim['metadata']['uid']}/region"
        assert node_shell("findmnt", "-n", "-o", "FSTYPE,OPTIONS", region).startswith("tmpfs "), region
        assert [pod_phase(kube, p) for p in ("trainer-a", "trainer-b")] == ["Running", "Running"]
        # The plugin's entry in the claim's status: what the device got, applied by the driver.
        entries = kube.wait_until("the claim's status entry", lambda: kube.get("resourceclaim", "shared-gpu")
                                  ["status"].get("devices"), timeout=30)
        assert [(e["driver"], e["device"], e["data"]["memoryLimit"]) for e in entries] == \
            [(DRIVER, results[0]["device"], str(4 * GiB))], entries
    finally:
        kube("delete", "-f", f"deploy/examples/{E2E}", "--ignore-not-found", "--wait=true", "--grace-period=1",
             timeout=180)


def test_the_status_writer_shares_status_devices_with_other_drivers(cluster):
    """The same scenario as tests/kubeletplugin/test_claim_status.py, here the judge: another
    driver's status entry stays, ours go at Unprepare, a recreated claim gets none of ours."""
    check_status_writer(config.new_client_from_config(config_file=cluster.kubeconfig))


def test_the_real_kubelet_shows_the_device_health_in_the_pod_status(installed):
    """KEP-4680: containerStatuses[].allocatedResourcesStatus, from the plugin's health stream."""
    kube = installed
    files = [f"deploy/examples/{E2E}/01-claims.yaml", f"deploy/examples/{E2E}/04-other-team.yaml"]
    try:
        kube("apply", "-f", files[0], "-f", files[1])
        kube.wait_ready("other")

        def health():
            statuses = kube.get("pod", "other")["status"]["containerStatuses"][0].get("allocatedResourcesStatus", [])
            found = [r["health"] for st in statuses for r in st["resources"]]
            return found if found and set(found) != {"Unknown"} else None
        assert kube.wait_until("a known device health in the pod status", health, timeout=30) == ["Healthy"]
    finally:
        kube("delete", "-f", files[1], "-f", files[0], "--ignore-not-found", "--wait=true", "--grace-period=1",
             timeout=180)


def test_the_admission_policy_refuses_a_bad_claim_at_apply(installed):
    kube = installed
    bad = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: bad-config, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpushare.dev}
    config:
    - opaque:
        driver: gpushare.dev
        parameters:
          apiVersion: gpushare.dev/v1alpha1
          kind: GpuShareConfig
          memoryLimit: 4Gx
"""
    out = kube.run("apply", "-f", "-", input=bad, check=False)
    assert out.returncode != 0, out.stdout
    assert "gpushare.dev-config" in out.stderr, out.stderr
    assert ("spec.devices.config[0].opaque.parameters.memoryLimit: not a valid quantity "
            "(examples: 4Gi, 512Mi, 1500000000) (got '4Gx')") in out.stderr, out.stderr
    assert kube.run("get", "resourceclaim", "bad-config", check=False).returncode != 0
    # a rule across two fields: a Latency claim that names a time-sliced strategy
    latency = bad.replace("memoryLimit: 4Gx", "sharingStrategy: TimeSlicing\n          priority: Latency")
    out = kube.run("apply", "-f", "-", input=latency, check=False)
    assert out.returncode != 0, out.stdout
    assert ("spec.devices.config[0].opaque.parameters.priority: Latency needs sharingStrategy MPS (the DeviceClass "
            "mps.gpushare.dev): under TimeSlicing a request waits for the other contexts' time slice and a context "
            "switch (got 'Latency')") in out.stderr, out.stderr


def test_apply_warns_about_a_config_above_its_request_and_shares_on_a_capacity_mode_cluster(installed):
    """What was silent: a config's memoryLimit above the request (the claim gets the request's
    2Gi) and a pod asking partition-mode shares where every node publishes capacity-mode GPUs
    (it stays Pending). kubectl prints each as a Warning line; both objects are admitted."""
    kube = installed
    body = yaml.safe_load(claim_manifest("config-above", memory="2Gi", compute="10"))
    body["metadata"]["name"] = "config-above"
    body["spec"]["devices"]["config"] = [{"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "gpushare.dev/v1alpha1", "kind": "GpuShareConfig", "memoryLimit": "8Gi"}}}]
    out = kube.run("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(body))
    assert "resourceclaim.resource.k8s.io/config-above created (server dry run)" in out.stdout, out.stdout
    assert ("Warning: Validation failed for ValidatingAdmissionPolicy 'gpushare.dev-requests-warnings' with binding "
            "'gpushare.dev-requests-warnings': spec.devices.config[0].opaque.parameters.memoryLimit: more than "
            "request 'gpu' asks (2Gi): the claim's limit is the smaller, 2Gi") in out.stderr, out.stderr
    modes = kube.wait_until("the plugin to publish its sharing mode on the DeviceClass", lambda: (
        kube.get("deviceclass", DRIVER)["metadata"].get("annotations", {}).get("gpushare.dev/sharing-modes")))
    assert "capacity" in modes.split(","), modes
    if modes != "capacity":  # a partition-mode run of a kept cluster left its mode (the list only grows)
        kube("annotate", "--overwrite", "deviceclass", DRIVER, "gpushare.dev/sharing-modes=capacity")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wants-shares", "namespace": "default"},
           "spec": {"containers": [{"name": "app", "image": "gpushare-dra:dev", "command": ["sleep", "1"],
                                    "resources": {"limits": {"gpushare.dev/share": 1}}}]}}
    out = kube.run("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod))
    assert "pod/wants-shares created (server dry run)" in out.stdout, out.stdout
    assert ("Warning: Validation failed for ValidatingAdmissionPolicy 'gpushare.dev-pod-warnings' with binding "
            "'gpushare.dev-pod-warnings': container 'app': gpushare.dev/share asks for partition-mode shares, but the "
            "nodes of this cluster publish capacity-mode GPUs only") in out.stderr, out.stderr


HOLDER_POD = """
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, labels: {{test: no-gpu-fits}}}}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims: [{{name: gpu, resourceClaimName: {name}}}]
  containers:
  - name: app
    image: gpushare-dra:dev
    command: ["sleep", "600"]
    resources: {{claims: [{{name: gpu}}]}}
"""


def test_a_claim_no_gpu_holds_now_gets_an_event_naming_each_gpus_free_capacity(installed):
    """70Gi of each 80Gi GPU taken: a 20Gi claim fits a GPU's size but no GPU's free memory. The
    scheduler says "cannot allocate all claims" on the pod; the claim gets NoGpuFits with each GPU."""
    kube = installed
    names = ("fill-0", "fill-1", "no-fit")
    try:
        for name in names[:2]:
            kube.apply(claim_manifest(name, memory="70Gi", compute="50"))
            kube.apply(HOLDER_POD.format(name=name))
        kube.wait_ready("fill-0", "fill-1", timeout=180)
        kube.apply(claim_manifest("no-fit", memory="20Gi", compute="10"))
        kube.apply(HOLDER_POD.format(name="no-fit"))
        told = kube.wait_until("the NoGpuFits Event on the claim", lambda: [
            e["message"] for e in kube.items("events", "--field-selector", "involvedObject.name=no-fit")
            if e.get("reason") == "NoGpuFits" and e["involvedObject"]["kind"] == "ResourceClaim"], timeout=90)
        assert told[0].startswith("no GPU of gpushare.dev can hold the claim now: request 'gpu' asks memory 20Gi, "
                                  "compute 10; "), told
        for gpu in ("gpu-0", "gpu-1"):
            assert (f"{kube.node} {gpu}: memory 10Gi free of 80Gi, compute 50 free of 100 (memory 20Gi asked, "
                    "10Gi free)") in told[0], told
        assert pod_phase(kube, "no-fit") == "Pending"
    finally:
        kube("delete", "pod", "-l", "test=no-gpu-fits", "--ignore-not-found", "--wait=true", timeout=180)
        kube("delete", "resourceclaim", *names, "--ignore-not-found")


GAP_POD = """
apiVersion: v1
kind: Pod
metadata: {name: during-replacement, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: gpu, resourceClaimTemplateName: gap-1gi}]
  containers:
  - name: app
    image: gpushare-dra:dev
    command: ["sleep", "600"]
    resources: {claims: [{name: gpu}]}
"""


def test_a_pod_created_while_the_plugin_pod_is_deleted_starts_at_once(installed):
    """The deleted plugin serves on until the kubelet registered the DaemonSet's next pod
    (--handover-timeout): the pod's prepare is answered at once instead of failing with "not
    registered" and waiting for the kubelet's resync, 60 to 90 s (docs/operations.md, Plugin pod
    replaced; hack/bench-plugin-gap measures every case)."""
    kube = installed
    [old] = [p for p in kube.items("pods", "-n", "gpushare-system", "-l", "app.kubernetes.io/name=gpushare-dra")
             if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName") == kube.node]
    try:
        kube.apply(claim_template("gap-1gi"))
        kube("delete", "pod", "-n", "gpushare-system", old["metadata"]["name"], "--wait=false")
        kube.apply(GAP_POD)
        kube.wait_ready("during-replacement", timeout=45)
        events = kube.items("events", "--field-selector", "involvedObject.name=during-replacement")
        failed = [e["message"] for e in events if e.get("reason") == "FailedPrepareDynamicResources"]
        assert not failed, failed
    finally:
        kube("delete", "pod", "during-replacement", "--ignore-not-found", "--wait=true", timeout=120)
        kube("delete", "resourceclaimtemplate", "gap-1gi", "--ignore-not-found")
        kube("-n", "gpushare-system", "rollout", "status", "daemonset/gpushare-kubelet-plugin", "--timeout=300s",
             timeout=320)


def plugin_token(kube, tmp_path):
    """kubectl as the plugin: a token the API server binds to the node's plugin pod, so it
    carries the pod's node name (authentication.kubernetes.io/node-name), as the pod's own does."""
    plugin = [p for p in kube.items("pods", "-n", "gpushare-system", "-l", "app.kubernetes.io/name=gpushare-dra")
              if p["spec"].get("nodeName") == kube.node and p["status"].get("phase") == "Running"][0]
    token = kube("create", "token", "gpushare-dra", "-n", "gpushare-system", "--bound-object-kind", "Pod",
                 "--bound-object-name", plugin["metadata"]["name"]).strip()
    as_plugin = kube.with_token(token, tmp_path / "plugin.kubeconfig")
    who = json.loads(as_plugin("auth", "whoami", "-o", "json"))["status"]["userInfo"]
    assert who["username"] == "system:serviceaccount:gpushare-system:gpushare-dra", who
    assert who["extra"]["authentication.kubernetes.io/node-name"] == [kube.node], who
    return as_plugin


SLICE_FOR = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: restriction-probe-{node}}}
spec:
  driver: {driver}
  nodeName: {node}
  pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}
  devices: [{{name: probe}}]
"""
OTHER_DRIVER = "other.example.com"


def claim_allocated_on(kube, name: str, node: str) -> None:
    """A claim allocated (by the admin, as a scheduler would) a gpushare device and another
    driver's on node, with the other driver's status entry written."""
    kube.apply(claim_manifest(name))
    results = [{"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"},
               {"request": "gpu", "driver": OTHER_DRIVER, "pool": "p", "device": "nic-0"}]
    on_node = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    kube("patch", "resourceclaim", name, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"allocation": {"devices": {"results": results}, "nodeSelector": on_node},
                    "devices": [{"driver": OTHER_DRIVER, "pool": "p", "device": "nic-0", "data": {"mac": "a"}}]}}))


def test_the_plugins_token_writes_only_its_own_driver_and_node(installed, tmp_path):
    """Least privilege (docs/security.md): the plugin's pod-bound token writes gpushare.dev's
    entries of a claim on its node and its node's slices; it is refused another driver's entry,
    a claim on another node and another node's slice, with the API server's own reasons."""
    kube = installed
    as_plugin = plugin_token(kube, tmp_path)

    def ours(node: str) -> dict:  # our entry for the device claim_allocated_on(node) gave
        return {"op": "add", "path": "/status/devices/-",
                "value": {"driver": DRIVER, "pool": node, "device": "gpu-0", "data": {"probe": 1}}}
    forged = {"op": "replace", "path": "/status/devices/0/data", "value": {"mac": "forged"}}  # the other driver's
    resource = client.ResourceV1Api(config.new_client_from_config(config_file=as_plugin.kubeconfig))

    def status_patch(name: str, op: dict) -> str | None:
        """None when the write is taken, else the API server's refusal (kubectl would GET first,
        which the plugin may not)."""
        try:
            resource.patch_namespaced_resource_claim_status(name, "default", [op],
                                                            _content_type="application/json-patch+json")
        except client.ApiException as e:
            return f"{e.status} {json.loads(e.body)['message']}"
        return None

    try:
        claim_allocated_on(kube, "least-privilege-here", kube.node)
        claim_allocated_on(kube, "least-privilege-there", "other-node")
        # The API server's check (422, status.devices: Forbidden) names the subresource and the driver.
        refused = status_patch("least-privilege-here", forged)
        assert refused and refused.startswith("422 ") and 'resource="resourceclaims/driver"' in refused \
            and f'"{OTHER_DRIVER}" is forbidden' in refused, refused
        refused = status_patch("least-privilege-there", ours("other-node"))  # our driver, another node's claim
        assert refused and refused.startswith("422 ") and 'verb="[arbitrary-node:patch]"' in refused \
            and f'"{DRIVER}" is forbidden' in refused and "must be an allocated device" not in refused, refused
        assert status_patch("least-privilege-here", ours(kube.node)) is None
        devices = {d["driver"]: d for d in kube.get("resourceclaim", "least-privilege-here")["status"]["devices"]}
        assert devices[DRIVER]["data"] == {"probe": 1} and devices[OTHER_DRIVER]["data"] == {"mac": "a"}, devices
        for ask in (["list", "pods"], ["update", "resourceclaims"],
                    ["patch", "resourceclaims", "--subresource=binding"],
                    ["arbitrary-node:patch", "resourceclaims/gpushare.dev", "--subresource=driver"]):
            assert as_plugin.run("auth", "can-i", *ask, check=False).stdout.strip() == "no", ask
        assert as_plugin("auth", "can-i", "associated-node:patch", "resourceclaims/gpushare.dev",
                         "--subresource=driver").strip() == "yes"

        def refused_for_other_node():  # the policy is in deploy/base: installed with the product
            out = as_plugin.run("create", "--dry-run=server", "-f", "-",
                                input=SLICE_FOR.format(node="other-node", driver=DRIVER), check=False)
            return out if out.returncode != 0 and "gpushare.dev-own-node-slices" in out.stderr else None
        out = kube.wait_until("the policy to refuse the slice", refused_for_other_node, timeout=60)
        assert (f"the gpushare plugin on node '{kube.node}' may only write ResourceSlices with "
                f"spec.nodeName '{kube.node}' (got 'other-node')") in " ".join(out.stderr.split()), out.stderr
        # Nor another driver's slice on its own node.
        out = as_plugin.run("create", "--dry-run=server", "-f", "-",
                            input=SLICE_FOR.format(node=kube.node, driver=OTHER_DRIVER), check=False)
        refusal = ("the gpushare plugin may only write ResourceSlices with spec.driver 'gpushare.dev' "
                   f"(got '{OTHER_DRIVER}')")
        assert out.returncode != 0 and refusal in " ".join(out.stderr.split()), out.stderr
        # Its own node's slice of its driver passes the policy (and RBAC).
        as_plugin("create", "--dry-run=server", "-f", "-",
                  input=SLICE_FOR.format(node=kube.node, driver=DRIVER))
    finally:
        kube("delete", "resourceclaim", "least-privilege-here", "least-privilege-there", "--ignore-not-found")


ROOT_POD = """
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  restartPolicy: Never
  resourceClaims: [{{name: gpu, resourceClaimTemplateName: root-1gi}}]
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: {command}
    resources: {{claims: [{{name: gpu}}]}}
"""
def run_root_pod(kube, name: str, image: str, command: list[str]) -> str:
    """A pod of image with a 1Gi claim, run to its end; its log (stdout and stderr)."""
    kube.apply(ROOT_POD.format(name=name, image=image, command=json.dumps(command)))
    phase = kube.wait_until(f"pod {name} to finish",
                            lambda: pod_phase(kube, name) if pod_phase(kube, name) in ("Succeeded", "Failed") else None,
                            timeout=180)
    log = kube.logs(name)
    assert phase == "Succeeded", (phase, log)
    return log


@pytest.mark.skipif(roots.why_not() is not None, reason=f"distribution roots: {roots.why_not()}")
def test_a_debian_11_image_and_a_musl_program_start_with_the_claim(installed, tmp_path):
    """No host /lib in the container: the roots come from Debian's registry (tests/support/roots.py)."""
    kube = installed
    bullseye = kube.load_root(roots.glibc_root("bullseye"), "gpushare-test/bullseye:1", tmp_path)
    musl = kube.load_root(roots.musl_root(), "gpushare-test/musl:1", tmp_path)
    try:
        kube.apply(claim_template("root-1gi"))
        script = f"{roots.PROBE} meminfo && ldd --version && {roots.PROBE} alloc --chunk 268435456 --max 2147483648"
        log = run_root_pod(kube, "debian11", bullseye, ["sh", "-c", script])
        assert f"cu_total={1 * GiB}" in log and ") 2.31" in log, log  # glibc 2.31, the claim's 1Gi
        assert f"allocated={1 * GiB} chunks=4 result=oom" in log, log
        log = run_root_pod(kube, "musl", musl, [roots.PROBE, "meminfo"])
        assert "the claim's library is not active in this program" in log, log  # it starts, says so, exits 0
    finally:
        kube("delete", "pod", "debian11", "musl", "--ignore-not-found", "--wait=true", "--grace-period=1", timeout=180)
        kube("delete", "resourceclaimtemplate", "root-1gi", "--ignore-not-found")


STRATEGY_POD = """
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, labels: {{test: strategies}}}}
spec:
  resourceClaims: [{{name: gpu, resourceClaimName: {name}}}]
  containers:
  - name: app
    image: gpushare-dra:dev
    command: ["sleep", "300"]
    resources: {{claims: [{{name: gpu}}]}}
"""


def test_the_real_scheduler_keeps_mps_claims_off_time_sliced_gpus(installed):
    """As installed every GPU is time-sliced: an MPS claim's pod stays pending with a
    FailedScheduling Event. Then the plugin with --mps-gpus=0: GPU 0 serves MPS claims only, GPU 1
    TimeSlicing and None; kube-scheduler, from the devices' sharingStrategy attribute and the
    classes' CEL selectors alone, puts both MPS claims on GPU 0 and the time-sliced one on GPU 1.
    (Allocation is the scheduler's: whether the MPS pods then start is the node's business, not
    checked here.)"""
    kube = installed
    ds = ["-n", "gpushare-system", "daemonset/gpushare-kubelet-plugin"]

    def strategies() -> dict[str, str]:
        return {d["name"]: d.get("attributes", {}).get("sharingStrategy", {}).get("string", "")
                for s in kube.items("resourceslices") if s["spec"]["driver"] == DRIVER for d in s["spec"]["devices"]}

    def device_of(name: str) -> str | None:
        allocation = kube.get("resourceclaim", name).get("status", {}).get("allocation")
        return allocation["devices"]["results"][0]["device"] if allocation else None

    def claim(name: str, device_class: str) -> None:
        body = yaml.safe_load(claim_manifest(name, memory="1Gi", compute="25"))
        body["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = device_class
        kube.apply(yaml.safe_dump(body))
        kube.apply(STRATEGY_POD.format(name=name))

    claims = {"mps-a": "mps.gpushare.dev", "mps-b": "mps.gpushare.dev", "sliced": "gpushare.dev"}
    try:
        assert set(strategies().values()) == {"TimeSlicing"}, strategies()
        claim("mps-a", claims["mps-a"])
        event = kube.wait_until("the MPS pod's FailedScheduling", lambda: [
            e["message"] for e in kube.items("events", "--field-selector", "involvedObject.name=mps-a")
            if e.get("reason") == "FailedScheduling"], timeout=120)
        assert device_of("mps-a") is None and pod_phase(kube, "mps-a") == "Pending", event

        kube("patch", *ds, "--type=json", "-p", json.dumps(
            [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--mps-gpus=0"}]))
        kube("rollout", "status", *ds, "--timeout=300s", timeout=320)
        kube.wait_until("GPU 0 published as MPS", lambda: strategies().get("gpu-0") == "MPS", timeout=120)
        assert strategies().get("gpu-1") == "TimeSlicing", strategies()
        for name in ("mps-b", "sliced"):
            claim(name, claims[name])
        got = kube.wait_until("every claim allocated (the pending one retried)", lambda: (
            d if all((d := {n: device_of(n) for n in claims}).values()) else None), timeout=120)
        assert got == {"mps-a": "gpu-0", "mps-b": "gpu-0", "sliced": "gpu-1"}, got
    finally:
        kube("delete", "pod", "-l", "test=strategies", "--ignore-not-found", "--wait=true", "--grace-period=0",
             "--force", timeout=180)
        kube("delete", "resourceclaim", *claims, "--ignore-not-found", "--wait=true", timeout=180)
        kube("apply", "-k", "deploy/overlays/mock")  # the manifests' args again
        kube("rollout", "status", *ds, "--timeout=300s", timeout=320)


def printed(kube, pod: str, marker: str) -> str | None:
    """The pod's log once it shows marker."""
    log = kube.logs(pod)
    return log if marker in log else None


def node_nvml(code: str, state: str = "/var/lib/gpushare/sim.state") -> object:
    """`code` (which sets `out`) with pynvml on the node's simulated NVML, GPU 0 as `g`: what an
    operator's nvidia-smi does on the node (the node is this machine)."""
    script = ("import json, pynvml; from dra_driver.discovery import load_nvml; "
              "from dra_driver.mig import MigInstances, read_profiles; "
              f"load_nvml({str(Path(native_paths()['sim_nvml']).parent)!r}); pynvml.nvmlInit(); "
              f"g = pynvml.nvmlDeviceGetHandleByIndex(0); out = None\n{code}\nprint(json.dumps(out))")
    env = {"GPUSHARE_SIM_STATE": state, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                          cwd=str(Path(__file__).parents[2]))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def mig_instances() -> object:
    """The MIG UUIDs of the node's simulated GPU 0, as NVML lists them."""
    return node_nvml("out = sorted(i.uuid for i in MigInstances(pynvml).list(pynvml.nvmlDeviceGetUUID(g), "
                     "read_profiles(pynvml, g) or ()))")


def test_the_real_scheduler_places_mig_instances_and_shares_one(installed):
    """The operator puts simulated GPU 0 in MIG mode (nvmlDeviceSetMigMode, as nvidia-smi does) and
    gives the plugin --mig-gpus=0: the API server keeps the MIG devices' counters, kube-scheduler
    places deploy/examples/mig's claims by them: a whole 3g.40gb, a second shared by two pods in
    8Gi slices (held to them), and the 1g.10gb that does not fit beside them stays Pending; the
    instances go with the pods."""
    kube = installed
    ds = ["-n", "gpushare-system", "daemonset/gpushare-kubelet-plugin"]
    docs = [d for d in yaml.safe_load_all(open("deploy/examples/mig/instances-and-slices.yaml")) if d]
    try:
        node_nvml("pynvml.nvmlDeviceSetMigMode(g, 1)")  # the operator: nvidia-smi -i 0 -mig 1
        kube("patch", *ds, "--type=json", "-p", json.dumps([
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--mig-gpus=0"}]))
        kube("rollout", "status", *ds, "--timeout=300s", timeout=320)
        kube.wait_until("MIG devices in the slices", lambda: [
            d for s in kube.items("resourceslices") if s["spec"]["driver"] == DRIVER
            for d in s["spec"].get("devices") or [] if d["name"].startswith("gpu-0-mig-")], timeout=120)
        kube.apply(yaml.safe_dump_all([d for d in docs if d["kind"] != "Pod"]))
        for pod in (d for d in docs if d["kind"] == "Pod"):
            kube.apply(yaml.safe_dump(pod))
            name = pod["metadata"]["name"]
            if name != "mig-small":
                kube.wait_ready(name)
        devices = {c["metadata"]["name"].rsplit("-mig-", 1)[0]: c["status"]["allocation"]["devices"]["results"][0][
            "device"] for c in kube.items("resourceclaims") if c.get("status", {}).get("allocation")}
        assert devices == {"mig-whole": "gpu-0-mig-3g-40gb-0", "mig-tenant-a": "gpu-0-mig-3g-40gb-4",
                           "mig-tenant-b": "gpu-0-mig-3g-40gb-4"}, devices
        assert len(mig_instances()) == 2
        out = kube.wait_until("mig-whole's meminfo", lambda: printed(kube, "mig-whole", "cu_total="))
        assert f"cu_total={40448 << 20}" in out, out
        out = kube.wait_until("mig-tenant-a's allocation", lambda: printed(kube, "mig-tenant-a", "result="))
        assert f"allocated={8 * GiB} chunks=" in out, out
        event = kube.wait_until("mig-small's FailedScheduling", lambda: [
            e["message"] for e in kube.items("events", "--field-selector", "involvedObject.name=mig-small")
            if e.get("reason") == "FailedScheduling"], timeout=120)
        assert pod_phase(kube, "mig-small") == "Pending", event
    finally:
        kube("delete", "pod", *(d["metadata"]["name"] for d in docs if d["kind"] == "Pod"), "--ignore-not-found",
             "--wait=true", "--grace-period=1", timeout=180)
        kube.wait_until("the MIG instances destroyed", lambda: mig_instances() == [], timeout=120)
        node_nvml("pynvml.nvmlDeviceSetMigMode(g, 0)")  # the GPU as the other tests know it
        kube("delete", "resourceclaimtemplate", *(d["metadata"]["name"] for d in docs if d["kind"] != "Pod"),
             "--ignore-not-found", timeout=60)
        kube("apply", "-k", "deploy/overlays/mock")  # the manifests' args again
        kube("rollout", "status", *ds, "--timeout=300s", timeout=320)


def test_kubectl_delete_k_leaves_nothing_on_the_node(installed):
    kube = installed
    kube("delete", "-k", "deploy/overlays/mock", "--wait=true", timeout=300)
    kube.wait_until("the plugin pods to be gone", lambda: not kube.items("pods", "-n", "gpushare-system"),
                    timeout=180)
    # Only this cluster's specs (cluster_specs): podman tests on the same machine write gpushare
    # specs of their own state dirs there, and an earlier cluster may have left some.
    assert cluster_specs() == []
    left = node_shell("sh", "-c", "ls /var/lib/gpushare/claims/ 2>/dev/null")
    assert left.strip() == "", left
