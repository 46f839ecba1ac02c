"""Fixtures of the real-cluster suite: ONE one-node cluster (hack/cluster-up: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, containerd, a kubelet), shared by every test here, with
the product installed as users install it (`kubectl apply -k deploy/overlays/mock`).

A cluster that already runs is reused and left running; one these tests started is stopped
with hack/cluster-down after the last test of this folder (package scope: the rest of
`make test` does not share the machine with a running cluster); GPUSHARE_CLUSTER_KEEP=1 keeps
it running, for a faster next run.
Every test skips, with the reason, where the cluster cannot be had: not root, a tool missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support import REPO

UP = REPO / "hack" / "cluster-up"
DOWN = REPO / "hack" / "cluster-down"
IMAGE = REPO / "hack" / "cluster" / "image"
CTR = REPO / ".cache" / "cluster" / "debs" / "usr" / "bin" / "ctr"  # hack/cluster/debs
SOCK = "/run/gpushare-cluster/containerd.sock"  # hack/cluster/lib.sh
STATE = Path(os.environ.get("CLUSTER_STATE", "/var/lib/gpushare-cluster"))
# What cluster-up needs on the host beyond what it builds or downloads into .cache/cluster.
HOST_TOOLS = ("go", "gcc", "openssl", "curl", "ip", "debootstrap", "apt-get", "dpkg")
_failed: list[str] = []  # cluster-up's output once it failed: the other tests fail at once with it
COLD_UP_TIMEOUT = 4800  # a cold Go build of the five binaries on 2 cores, the image and the debs


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "the real cluster needs root (a kubelet and containerd run on this machine)"
    missing = [t for t in HOST_TOOLS if shutil.which(t) is None]
    if missing:
        return f"hack/cluster-up needs {', '.join(missing)} on PATH (hack/test-deps installs them as root)"
    return None


class Kube:
    """kubectl of the cluster's own release, with the cluster's admin kubeconfig."""

    def __init__(self, kubectl: str, kubeconfig: str, node: str):
        self.kubectl, self.kubeconfig, self.node = kubectl, kubeconfig, node
        self.install: subprocess.CompletedProcess[str] | None = None  # `kubectl apply -k` of the overlay

    def run(self, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [self.kubectl, f"--kubeconfig={self.kubeconfig}", *args]
        out = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, cwd=REPO)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
        return out

    def __call__(self, *args: str, **kw) -> str:
        return self.run(*args, **kw).stdout

    def get(self, *args: str) -> dict:
        return json.loads(self("get", *args, "-o", "json"))

    def items(self, *args: str) -> list[dict]:
        return self.get(*args)["items"]

    def apply(self, manifest: str) -> str:
        """kubectl apply -f - of YAML text; returns what kubectl printed (stdout and stderr)."""
        out = self.run("apply", "-f", "-", input=manifest)
        return out.stdout + out.stderr

    def wait_until(self, what: str, predicate, timeout: float = 180, every: float = 2):
        """Polls predicate() until it returns something truthy; fails naming what it waited for."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
            except (AssertionError, KeyError, IndexError, subprocess.TimeoutExpired) as e:
                last = e
            else:
                if last:
                    return last
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")

    def with_token(self, token: str, path: Path) -> Kube:
        """The same kubectl and server, authenticated by token alone (a kubeconfig written at path)."""
        config = yaml.safe_load(Path(self.kubeconfig).read_text())
        config["users"] = [{"name": "token", "user": {"token": token}}]
        config["contexts"][0]["context"]["user"] = "token"
        path.write_text(yaml.safe_dump(config))
        return Kube(self.kubectl, str(path), self.node)

    def load_root(self, root: Path, tag: str, workdir: Path) -> str:
        """The folder root as image tag in the node's containerd (hack/cluster/image --pack, ctr import)."""
        tarball = workdir / "image.tar"
        for cmd in ([str(IMAGE), "--pack", str(root), tag, str(tarball)],
                    [str(CTR), "--address", SOCK, "-n", "k8s.io", "images", "import", "--local", str(tarball)]):
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout}{out.stderr}"
        tarball.unlink()
        return tag

    def logs(self, pod: str, container: str | None = None, namespace: str = "default") -> str:
        args = ["logs", "-n", namespace, pod] + (["-c", container] if container else [])
        return self(*args)


def _parse_up_output(stdout: str) -> tuple[str, str]:
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("export KUBECONFIG="), f"cluster-up's last line: {lines[-1:]}"
    kubeconfig = lines[-1].split("=", 1)[1]
    path_line = next(ln for ln in lines if ln.startswith("export PATH="))
    kbin = path_line.split("=", 1)[1].split(":", 1)[0]
    return kubeconfig, str(Path(kbin) / "kubectl")


@pytest.fixture(scope="package")
def cluster() -> Iterator[Kube]:
    """The running cluster (started here unless one runs already); stopped at the end if started here."""
    if why := why_not():
        pytest.skip(why)
    if _failed:
        pytest.fail(f"hack/cluster-up failed for an earlier test:\n{_failed[0]}", pytrace=False)
    already = (STATE / "pids" / "kubelet.pid").exists()
    start = time.monotonic()
    proc = subprocess.run([str(UP)], capture_output=True, text=True, timeout=COLD_UP_TIMEOUT)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
        _failed.append(tail)
        pytest.fail(f"hack/cluster-up exited {proc.returncode}:\n{tail}", pytrace=False)
    print(f"\ncluster-up: {time.monotonic() - start:.0f}s")
    kubeconfig, kubectl = _parse_up_output(proc.stdout)
    node = json.loads(subprocess.run([kubectl, f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "json"],
                                     capture_output=True, text=True, check=True).stdout)["items"][0]
    kube = Kube(kubectl, kubeconfig, node["metadata"]["name"])
    try:
        yield kube
    finally:
        if not already and not os.environ.get("GPUSHARE_CLUSTER_KEEP"):
            subprocess.run([str(DOWN)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="package")
def installed(cluster: Kube) -> Kube:
    """The product as users install it: kubectl apply -k deploy/overlays/mock, the plugin Running.
    What the API server refused is kept (cluster.install) for the first test to report: an object
    refused (an admission policy, say) fails that test, not every test."""
    cluster.install = cluster.run("apply", "-k", "deploy/overlays/mock", check=False)
    cluster("-n", "gpushare-system", "rollout", "status", "daemonset/gpushare-kubelet-plugin",
            "--timeout=300s", timeout=320)
    cluster.wait_until("ResourceSlices of gpushare.dev for the node", lambda: [
        s for s in cluster.items("resourceslices")
        if s["spec"]["driver"] == "gpushare.dev" and s["spec"].get("nodeName") == cluster.node])
    return cluster


def examples(path: str, image: str = "gpushare-dra:dev") -> str:
    """A deploy/examples file as YAML text; images no registry here serves become the product's
    image (it has the probe and a shell: the examples' `sleep infinity` and probe runs work)."""
    docs = list(yaml.safe_load_all((REPO / "deploy" / "examples" / path).read_text()))
    for doc in docs:
        spec = (doc or {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if not c["image"].startswith("gpushare-dra"):
                c["image"] = image
    return yaml.safe_dump_all([d for d in docs if d])


@pytest.fixture(scope="package")
def example_text():
    return examples


def claim_template(name: str, memory: str = "1Gi", compute: str = "10") -> str:
    """A ResourceClaimTemplate in default asking one gpushare.dev device of that memory and compute."""
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}, namespace: default}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpushare.dev
          capacity: {{requests: {{memory: {memory}, compute: "{compute}"}}}}
"""


ROLLING_PODS = 6
ROLLING_POD = """
apiVersion: v1
kind: Pod
metadata: {{name: rolling-{i}, namespace: default, labels: {{test: rolling}}}}
spec:
  restartPolicy: Never
  resourceClaims: [{{name: gpu, resourceClaimTemplateName: rolling}}]
  containers:
  - name: app
    image: gpushare-dra:dev
    command: ["sh", "-c", '"$(gpushare-dra hook-path probe)" meminfo && sleep 5']
    resources: {{claims: [{{name: gpu}}]}}
"""


def pods_start_while(kube: Kube, replace_plugin, namespace: str = "gpushare-system") -> None:
    """Pods with 1Gi claims of their own start (one every 2 s) and stop while replace_plugin()
    makes the real kubelet replace the plugin (a rollout): every pod must run with its 1Gi."""
    try:
        kube.apply(claim_template("rolling"))
        replace_plugin()
        for i in range(ROLLING_PODS):
            kube.apply(ROLLING_POD.format(i=i))
            time.sleep(2)
        kube("-n", namespace, "rollout", "status", "daemonset/gpushare-kubelet-plugin", "--timeout=300s", timeout=320)

        def finished():
            phases = [p["status"].get("phase") for p in kube.items("pods", "-l", "test=rolling")]
            return phases if all(ph in ("Succeeded", "Failed") for ph in phases) else None
        phases = kube.wait_until("the rolling pods to finish", finished, timeout=300)
        logs = {f"rolling-{i}": kube.logs(f"rolling-{i}") for i in range(ROLLING_PODS)}
        assert phases == ["Succeeded"] * ROLLING_PODS, (phases, logs)
        for name, log in logs.items():
            assert f"cu_total={1024 ** 3}" in log, (name, log)
    finally:
        kube("delete", "pods", "-l", "test=rolling", "--ignore-not-found", "--wait=true", "--grace-period=1",
             timeout=180)
        kube("delete", "resourceclaimtemplate", "rolling", "--ignore-not-found")

