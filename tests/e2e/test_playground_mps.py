"""`gpushare-dra playground --mps-gpus all` with the real kubectl: deploy/examples/latency, an
inference server's claim with `priority: Latency` beside a training job's (Batch), both through
DeviceClass mps.gpushare.dev. Both pods run; each claim's CDI spec makes its containers clients of
the GPU's MPS server at its share, the server's streams NORMAL and the trainer's BELOW_NORMAL."""

import json
from pathlib import Path

import pytest

from tests.support.kubectl import needs_kubectl
from tests.support.playground import objects, playground, prepared, wait_for

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "deploy/examples/latency/inference-beside-training.yaml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with playground(tmp_path_factory.mktemp("mps"), "--mps-gpus", "all") as started:
        yield started


@needs_kubectl
def test_a_latency_claim_and_a_batch_claim_run_under_mps_with_their_priorities(cluster):
    kubectl, node_dir = cluster
    kubectl("apply", "-f", EXAMPLE)
    pods = {"inference-server", "training-job"}
    wait_for("both example pods Running", lambda: {p["metadata"]["name"] for p in objects(kubectl, "pods")
                                                   if p["status"].get("phase") == "Running"} == pods or None)
    claims = {c["metadata"]["name"]: c for c in objects(kubectl, "resourceclaims")}
    env = {}
    for name in ("inference", "training"):
        uid = claims[name]["metadata"]["uid"]
        spec = json.loads((node_dir / "cdi" / f"k8s.gpushare.dev-claim_{uid}.json").read_text())
        env[name] = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
        (device,) = claims[name]["status"]["devices"]
        assert device["data"]["sharingStrategy"] == "MPS", device
        assert device["data"]["priority"] == ("Latency" if name == "inference" else "Batch"), device
    assert {n: (e["GPUSHARE_SHARING_STRATEGY"], e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
                e["CUDA_MPS_CLIENT_PRIORITY"]) for n, e in env.items()} == {
        "inference": ("MPS", "50", "0"), "training": ("MPS", "50", "1")}
    kubectl("delete", "-f", EXAMPLE)
    wait_for("both claims unprepared", lambda: not prepared(node_dir))
