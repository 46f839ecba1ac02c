"""`gpushare-dra playground --mig-gpus 0` on a simulated H100 80GB in MIG mode, with the real
kubectl and deploy/examples/mig: a 3g.40gb instance for one pod, a second 3g.40gb instance shared
by two pods in slices (each held to its 8Gi by the library), a 1g.10gb that does not fit beside
them stays Pending, and the instances are gone once the pods are (docs/mig.md)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from dra_driver.hookpath import native_paths
from tests.support.kubectl import needs_kubectl
from tests.support.playground import meminfo, objects, playground, pod_events, prepared, wait_for

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "deploy/examples/mig/instances-and-slices.yaml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("mig")
    gpus = work / "gpus.yaml"
    gpus.write_text(yaml.safe_dump({"gpus": [{"memory": "80Gi", "migMode": True}]}))
    with playground(work, "--mock-gpus", str(gpus), "--mig-gpus", "0") as started:
        yield started


def instances(node_dir: Path) -> list[tuple[int, str]]:
    """(placement, MIG UUID) of the simulated GPU's instances, as NVML lists them."""
    script = textwrap.dedent(f"""
        import json, pynvml
        from dra_driver.discovery import load_nvml
        from dra_driver.mig import MigInstances, read_profiles
        load_nvml({str(Path(native_paths()["sim_nvml"]).parent)!r})
        pynvml.nvmlInit()
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        found = MigInstances(pynvml).list(pynvml.nvmlDeviceGetUUID(gpu), read_profiles(pynvml, gpu))
        print(json.dumps(sorted([i.start, i.uuid] for i in found)))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")} | {
        "GPUSHARE_SIM_STATE": str(node_dir / "state" / "sim.state")}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    return [tuple(i) for i in json.loads(out.stdout)]


@needs_kubectl
def test_instances_made_for_claims_shared_in_slices_and_gone_with_the_pods(cluster):
    kubectl, node_dir = cluster
    # in the file's order, each pod Running before the next: the scheduler takes pods in any order,
    # and a 1g.10gb placed first leaves room for one 3g.40gb only
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all([d for d in docs if d["kind"] != "Pod"]))
    for pod in (d for d in docs if d["kind"] == "Pod"):
        kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
        name = pod["metadata"]["name"]
        if name != "mig-small":
            wait_for(f"{name} Running", lambda name=name: json.loads(kubectl("get", "pod", name, "-o", "json"))[
                "status"].get("phase") == "Running")
    claims = {c["metadata"]["name"].rsplit("-mig-", 1)[0]: c for c in objects(kubectl, "resourceclaims")}
    devices = {pod: c["status"]["allocation"]["devices"]["results"][0]["device"] for pod, c in claims.items()
               if c.get("status", {}).get("allocation")}
    assert devices == {"mig-whole": "gpu-0-mig-3g-40gb-0", "mig-tenant-a": "gpu-0-mig-3g-40gb-4",
                       "mig-tenant-b": "gpu-0-mig-3g-40gb-4"}, devices
    made = dict(instances(node_dir))
    assert sorted(made) == [0, 4]
    whole = wait_for("mig-whole's meminfo", lambda: meminfo(kubectl("logs", "mig-whole")))
    assert whole["cu_total"] == str(40448 << 20), whole  # the instance's memory
    tenant = wait_for("mig-tenant-b's meminfo", lambda: meminfo(kubectl("logs", "mig-tenant-b")))
    assert tenant["cu_total"] == str(8 << 30), tenant  # its slice of the instance
    # held to its budget: 8 of the 12 1Gi steps it tries
    held = wait_for("mig-tenant-a's allocation",
                    lambda: "result=" in (log := kubectl("logs", "mig-tenant-a")) and log)
    assert f"allocated={8 << 30} chunks=" in held, held
    # the 1g.10gb does not fit beside two 3g.40gb: Pending, the scheduler says why
    why = wait_for("mig-small's FailedScheduling for the counters", lambda: [
        m for m in pod_events(kubectl, "mig-small", "FailedScheduling") if "counter" in m])[0]
    assert "counter gpu-0-mig/memory-slice-" in why and "0 left" in why, why
    assert json.loads(kubectl("get", "pod", "mig-small", "-o", "json"))["status"]["phase"] == "Pending"
    kubectl("delete", "-f", EXAMPLE)
    wait_for("the claims unprepared", lambda: not prepared(node_dir))
    assert instances(node_dir) == []
