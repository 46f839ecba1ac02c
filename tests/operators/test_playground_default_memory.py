"""In the playground (its own process, the real kubectl): a claim that asks only for compute is
allocated the default memory, 1/8 of the GPU, and its container sees that as its limit; two such
claims share one GPU. The apply prints the warning when the shipped policies are applied."""

from __future__ import annotations

import json

from tests.support.deploy import DEPLOY
from tests.support.kubectl import needs_kubectl
from tests.support.playground import meminfo, objects, playground, prepared, wait_for

CLAIMS = "\n---\n".join(f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: compute-only-{i}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpushare.dev
        capacity: {{requests: {{compute: "10"}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: compute-only-{i}}}
spec:
  resourceClaims: [{{name: gpu, resourceClaimName: compute-only-{i}}}]
  containers:
  - name: c
    image: x
    command: ["sh", "-c", "\\"$(gpushare-dra hook-path probe)\\" meminfo && sleep infinity"]
    resources: {{claims: [{{name: gpu}}]}}
""" for i in (0, 1))


@needs_kubectl
def test_compute_only_claims_get_the_default_memory_and_share_a_gpu(tmp_path):
    with playground(tmp_path) as (kubectl, node_dir):
        warned = kubectl.run("apply", "-f", DEPLOY / "base" / "admission-requests.yaml")
        assert warned.returncode == 0, warned.stderr
        out = kubectl.run("apply", "-f", "-", input=CLAIMS)
        assert "asks for compute and no memory: it gets the default, 1/8 of the GPU's memory" in out.stderr
        try:
            def running():
                pods = objects(kubectl, "pods")
                return pods if len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods) else None

            wait_for("both compute-only pods Running", running)
            devices = set()
            for i in (0, 1):
                claim = json.loads(kubectl("get", "resourceclaim", f"compute-only-{i}", "-o", "json"))
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                assert result["consumedCapacity"] == {"memory": "10Gi", "compute": "10"}, result
                devices.add(result["device"])
                info = wait_for(f"compute-only-{i}'s meminfo",
                                lambda i=i: meminfo(kubectl("logs", f"compute-only-{i}")))
                assert info["cu_total"] == str(10 << 30), info  # its limit: the default memory
            assert devices == {"gpu-0"}, devices  # both on one GPU: neither took all of its memory
        finally:
            kubectl("delete", "--ignore-not-found", "-f", "-", input=CLAIMS)
        wait_for("the claims unprepared", lambda: not prepared(node_dir))
