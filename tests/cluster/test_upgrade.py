"""Releases on the real one-node cluster: `make image`'s archive loads into another runtime
(podman) and runs as the version it is tagged with; and a `helm upgrade` from the previous
release (its image and chart built from its commit, CHANGELOG.md names it) to the working tree,
with a claim's pods running throughout, as NVIDIA's dra-driver (tests/bats/test_gpu_updowngrade.bats)
and KAI (hack/run-e2e-upgrade-kind.sh) test theirs.

The upgrade, measured (0.1.0 to 0.2.0, the 2-core machine shared with other work, two runs): 10.3 and 10.7 s from
`helm upgrade` to the old plugin pod gone, 0.00 s without a registered plugin (sampled every
50 ms), 0 pods restarted; the test prints its figures (pytest -s).
Runs after test_helm_install.py, which leaves no install; run alone, it removes the kustomize one.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from playground.containers import OWNER_LABEL, podman_env
from tests.support import REPO, GiB
from tests.support.cluster import (
    CHART,
    CTR,
    NAMESPACE,
    RELEASE,
    SOCK,
    Helm,
    Kube,
    plugin_pods,
    without_kustomize_install,
)
from tests.support.release import build_previous, version

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]

REGISTRY = Path("/var/lib/kubelet/plugins_registry")  # the kubelet's: each plugin's registration socket
PLUGIN_DIR = Path("/var/lib/kubelet/plugins/gpushare.dev")  # the plugin's DRA sockets, dra-<pod uid>.sock
HOOK_DIR = Path("/opt/gpushare/lib")  # libgpushare.so -> libgpushare-<hash>.so, one build per release
CDI_DIR = Path("/var/run/cdi")
CLAIMS_DIR = Path("/var/lib/gpushare/claims")
MOCK = ["--set", "mock.enabled=true", "--set", "image.pullPolicy=Never"]


def test_make_image_writes_an_archive_podman_loads_and_runs_as_its_version(cluster: Kube, tmp_path: Path):
    """`make image` (the tarball cluster-up imported into containerd, cached) loaded by podman:
    tagged with pyproject.toml's version, whose --version it prints."""
    made = subprocess.run(["make", "-s", "image", f"DIST={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    assert made.returncode == 0, made.stderr
    archive = tmp_path / f"gpushare-dra-{version()}.tar"
    assert made.stdout.strip().splitlines()[-1] == str(archive), made.stdout
    names = [f"localhost/gpushare-dra:{version()}", "localhost/gpushare-dra:dev"]
    env = podman_env(str(tmp_path))  # runc without setrlimit, which this sandbox refuses
    had = {n for n in names if subprocess.run(["podman", "image", "exists", n], env=env).returncode == 0}
    try:
        loaded = subprocess.run(["podman", "load", "-i", str(archive)], capture_output=True, text=True, timeout=600,
                                env=env)
        assert loaded.returncode == 0, loaded.stderr
        assert f"Loaded image: localhost/gpushare-dra:{version()}" in loaded.stdout, loaded.stdout
        ran = subprocess.run(["podman", "run", "--rm", "--network=none", "--runtime", "runc", "--label",
                              f"{OWNER_LABEL}={tmp_path}", f"localhost/gpushare-dra:{version()}", "--version"],
                             capture_output=True, text=True, timeout=300, env=env)
        assert ran.stdout.startswith(f"gpushare-dra {version()} (Python 3.11"), (ran.stdout, ran.stderr)
    finally:
        for name in set(names) - had:
            subprocess.run(["podman", "rmi", "--force", name], capture_output=True, timeout=300, env=env)


def ctr(*args: str) -> str:
    out = subprocess.run([str(CTR), "--address", SOCK, "-n", "k8s.io", *args], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, f"ctr {' '.join(args)}: {out.stderr}"
    return out.stdout


class RegistryWatch(threading.Thread):
    """Samples the kubelet's plugin registry every 50 ms: the longest time with no registration
    socket of gpushare.dev (the gap in which a new pod's NodePrepareResources would fail)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.gap = 0.0
        self.uids: set[str] = set()

    def run(self) -> None:
        since = None
        while not self.stop.wait(0.05):
            mine = [n for n in os.listdir(REGISTRY) if n.startswith("gpushare.dev")]
            self.uids.update(mine)
            now = time.monotonic()
            if mine:
                since = None
            else:
                since = since or now
                self.gap = max(self.gap, now - since)


SHARED_POD = """
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, labels: {{test: upgrade}}}}
spec:
  terminationGracePeriodSeconds: 5
  resourceClaims: [{{name: gpu, resourceClaimName: {claim}}}]
  containers:
  - name: app
    image: gpushare-dra:dev
    # sh, pid 1, ends at SIGTERM (the trap); the probe allocates, prints what it got, holds it
    command: ["sh", "-c", 'trap "exit 0" TERM; "$(gpushare-dra hook-path probe)" alloc --chunk 536870912
      --max {max} --hold 3600 & wait']
    resources: {{claims: [{{name: gpu}}]}}
"""
# On GPU 0: 0.1.0's specs for the simulator do not name the claim's GPUs (its containers see
# every simulated GPU), and the probe allocates on device 0.
CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: default, labels: {{test: upgrade}}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpushare.dev
        capacity: {{requests: {{memory: {memory}, compute: "10"}}}}
        selectors: [{{cel: {{expression: 'device.attributes["gpushare.dev"].index == 0'}}}}]
"""


def held(kube: Kube, pod: str) -> tuple[int, str] | None:
    """(bytes, result) of the probe's `allocated=N chunks=M result=R` line, once printed."""
    for line in kube.logs(pod).splitlines():
        if line.startswith("allocated=") and " result=" in line:
            return int(line.split()[0].split("=")[1]), line.split("result=")[1]
    return None


def build_of(spec_text: str) -> str | None:
    return next((w for w in spec_text.replace('"', " ").split() if "/libgpushare-" in w), None)


def specs_of(claim_uid: str) -> list[Path]:
    return [p for p in CDI_DIR.glob("*gpushare*") if claim_uid in p.read_text()]


def test_upgrade_from_the_previous_release(cluster: Kube, helm: Helm):
    """helm install of the previous release; a claim of 4Gi whose two pods each hold 1.5Gi;
    helm upgrade to the working tree's chart (its appVersion: the image `make image` tags);
    then: the two pods run on (same pods, no restart), a third pod of the claim gets the 1Gi left
    (one budget across the old pods and the new), a pod of a new claim is prepared by the new
    plugin (its CDI spec names the new library build), the kubelet always had a registered
    plugin, and once the pods and claims are gone nothing of the old release is left: its library
    build, CDI specs, sockets, claim folders, images in pods or the DaemonSet."""
    kube = cluster
    old = build_previous()
    assert old.version != version(), (old.version, version())
    ctr("images", "import", "--local", str(old.image))  # gpushare-dra:<old version>, beside :dev and :<version>
    without_kustomize_install(kube)
    watch = RegistryWatch()
    try:
        helm("install", RELEASE, str(old.chart), "-n", NAMESPACE, "--create-namespace", *MOCK, "--wait",
             "--timeout", "5m")
        [old_pod] = plugin_pods(kube)
        assert old_pod["spec"]["containers"][0]["image"] == f"gpushare-dra:{old.version}"
        kube.wait_until("the old plugin's ResourceSlices", lambda: [
            s for s in kube.items("resourceslices")
            if s["spec"]["driver"] == "gpushare.dev" and s["spec"].get("nodeName") == kube.node])
        old_build = os.readlink(HOOK_DIR / "libgpushare.so")

        kube.apply(CLAIM.format(name="upgrade-shared", memory="4Gi"))
        for name in ("upgrade-a", "upgrade-b"):
            kube.apply(SHARED_POD.format(name=name, claim="upgrade-shared", max=3 * GiB // 2))
        kube.wait_ready("upgrade-a", "upgrade-b")
        for name in ("upgrade-a", "upgrade-b"):
            assert kube.wait_until(f"{name}'s probe", lambda n=name: held(kube, n), timeout=90) == \
                (3 * GiB // 2, "max")
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kube.items("pods", "-l", "test=upgrade")}
        shared_uid = kube.get("resourceclaim", "upgrade-shared")["metadata"]["uid"]
        [shared_spec] = specs_of(shared_uid)
        assert build_of(shared_spec.read_text()).endswith(old_build), shared_spec.read_text()

        watch.start()
        start = time.monotonic()
        # The new chart's defaults, then the values this release was installed with (no image.tag:
        # the new chart's appVersion names the image).
        helm("upgrade", RELEASE, CHART, "-n", NAMESPACE, "--reset-then-reuse-values", "--wait", "--timeout", "5m")
        kube("-n", NAMESPACE, "rollout", "status", "daemonset/gpushare-kubelet-plugin", "--timeout=300s", timeout=320)
        old_uid = old_pod["metadata"]["uid"]
        kube.wait_until("the old plugin pod gone", lambda: old_uid not in {
            p["metadata"]["uid"] for p in plugin_pods(kube)}, timeout=120, every=0.5)
        upgrade_s = time.monotonic() - start
        [new_pod] = plugin_pods(kube)
        images = {c["image"] for c in new_pod["spec"]["containers"] + new_pod["spec"]["initContainers"]}
        assert images == {f"gpushare-dra:{version()}"}, images
        new_build = os.readlink(HOOK_DIR / "libgpushare.so")
        assert new_build != old_build, "the two releases' libraries are the same build: the test shows nothing"

        # The claim's pods ran on through the upgrade: the same pods, no container restarted.
        pods = {p["metadata"]["name"]: p for p in kube.items("pods", "-l", "test=upgrade")}
        assert {n: p["metadata"]["uid"] for n, p in pods.items()} == before
        restarts = {n: sum(c["restartCount"] for c in p["status"]["containerStatuses"]) for n, p in pods.items()}
        assert restarts == {"upgrade-a": 0, "upgrade-b": 0}, restarts
        assert {p["status"]["phase"] for p in pods.values()} == {"Running"}

        # One budget still: a third pod of the claim gets what the two old ones left, 1Gi of 4Gi.
        kube.apply(SHARED_POD.format(name="upgrade-c", claim="upgrade-shared", max=2 * GiB))
        # A new claim is prepared by the new plugin: its spec names the new build.
        kube.apply(CLAIM.format(name="upgrade-own", memory="1Gi"))
        kube.apply(SHARED_POD.format(name="upgrade-d", claim="upgrade-own", max=2 * GiB))
        kube.wait_ready("upgrade-c", "upgrade-d")
        assert kube.wait_until("upgrade-c's probe", lambda: held(kube, "upgrade-c"), timeout=90) == (GiB, "oom")
        assert kube.wait_until("upgrade-d's probe", lambda: held(kube, "upgrade-d"), timeout=90) == (GiB, "oom")
        [own_spec] = specs_of(kube.get("resourceclaim", "upgrade-own")["metadata"]["uid"])
        assert build_of(own_spec.read_text()).endswith(new_build), own_spec.read_text()
        watch.stop.set()
        watch.join()
        print(f"\nupgrade {old.version} -> {version()}: helm upgrade to the old plugin pod gone {upgrade_s:.1f}s, "
              f"longest time without a registered plugin {watch.gap:.2f}s, pods restarted {sum(restarts.values())}")
        assert watch.gap == 0.0, f"the kubelet had no gpushare.dev plugin registered for {watch.gap:.2f}s"

        # The pods and claims end: nothing of the old release is left.
        kube("delete", "pods", "-l", "test=upgrade", "--wait=true", timeout=180)
        kube("delete", "resourceclaims", "-l", "test=upgrade", "--wait=true", timeout=180)

        def old_left() -> list[str]:
            left = [str(p) for p in (HOOK_DIR / old_build, *specs_of(shared_uid), CLAIMS_DIR / shared_uid)
                    if p.exists()]
            left += [f"{d}/{n}" for d in (REGISTRY, PLUGIN_DIR) for n in os.listdir(d) if old_uid in n]
            left += [f"pod {p['metadata']['namespace']}/{p['metadata']['name']}"
                     for p in kube.items("pods", "-A") for c in p["spec"]["containers"]
                     if c["image"] == f"gpushare-dra:{old.version}"]
            return left
        kube.wait_until("nothing of the old release left", lambda: not old_left(), timeout=60)
        ds = kube.get("daemonset", "-n", NAMESPACE, "gpushare-kubelet-plugin")["spec"]["template"]["spec"]
        assert {c["image"] for c in ds["containers"] + ds["initContainers"]} == {f"gpushare-dra:{version()}"}
        history = json.loads(helm("history", RELEASE, "-n", NAMESPACE, "-o", "json"))
        assert [(h["chart"], h["app_version"], h["status"]) for h in history] == [
            (f"gpushare-dra-{old.version}", old.version, "superseded"),
            (f"gpushare-dra-{version()}", version(), "deployed")], history
    finally:
        watch.stop.set()
        kube("delete", "pods", "-l", "test=upgrade", "--ignore-not-found", "--wait=true", "--grace-period=1",
             timeout=180)
        kube("delete", "resourceclaims", "-l", "test=upgrade", "--ignore-not-found", "--wait=true", timeout=180)
        if RELEASE in helm("list", "-n", NAMESPACE, "-q").split():
            helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "5m")
        kube.wait_until("the plugin pods to be gone", lambda: not plugin_pods(kube), timeout=180)
        subprocess.run([str(CTR), "--address", SOCK, "-n", "k8s.io", "images", "rm",
                        f"docker.io/library/gpushare-dra:{old.version}"], capture_output=True, timeout=120)
