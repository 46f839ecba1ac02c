"""The real one-node cluster of hack/cluster-up as tests/cluster drives it: kubectl of the
cluster's release (Kube), and what several tests there run (a claim template, pods that start
while the plugin is replaced, the examples with the product's image)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from tests.support import REPO

UP = REPO / "hack" / "cluster-up"
DOWN = REPO / "hack" / "cluster-down"
IMAGE = REPO / "hack" / "cluster" / "image"
CTR = REPO / ".cache" / "cluster" / "debs" / "usr" / "bin" / "ctr"  # hack/cluster/debs
SOCK = "/run/gpushare-cluster/containerd.sock"  # hack/cluster/lib.sh
STATE = Path(os.environ.get("CLUSTER_STATE", "/var/lib/gpushare-cluster"))
RUN_DIR = "/run/gpushare-cluster"  # hack/cluster/lib.sh run_dir
CGROUP_ROOT = "gpushare-cluster"  # hack/cluster/lib.sh cgroup_root: the kubelet's cgroupRoot
PLUGIN_STATE = "/var/lib/gpushare"  # the plugin's state dir on the node (deploy/base)
CDI_KIND = "k8s.gpushare.dev/claim"
# What cluster-up needs on the host beyond what it builds or downloads into .cache/cluster.
HOST_TOOLS = ("go", "gcc", "openssl", "curl", "ip", "debootstrap", "apt-get", "dpkg")
up_failures: list[str] = []  # cluster-up's output once it failed: the other tests fail at once with it


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "the real cluster needs root (a kubelet and containerd run on this machine)"
    missing = [t for t in HOST_TOOLS if shutil.which(t) is None]
    if missing:
        return f"hack/cluster-up needs {', '.join(missing)} on PATH (hack/test-deps installs them as root)"
    return None


def cluster_specs(dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")) -> list[str]:
    """The CDI specs this cluster's plugin wrote, judged as hack/cluster/lib.sh's cluster_spec
    judges them for cluster-down: the plugin's kind, a mount of its state dir, written since
    cluster-up (STATE/up-since). Other vendors' specs, and gpushare specs of other runs (a podman
    test's own state dir, an earlier cluster's day-old file) are not."""
    try:
        since = (STATE / "up-since").stat().st_mtime_ns
    except FileNotFoundError:
        return []
    found = []
    for folder in dirs:
        for path in sorted(Path(folder).glob("*")) if os.path.isdir(folder) else []:
            try:
                if path.stat().st_mtime_ns <= since or not path.is_file():
                    continue
                doc = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(doc, dict) and doc.get("kind") == CDI_KIND and f"{PLUGIN_STATE}/" in json.dumps(doc):
                found.append(str(path))
    return found


def _lines(*cmd: str) -> list[str]:
    return sorted(subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.splitlines())


def host_traces() -> dict[str, list[str]]:
    """What a cluster shows on the host, by kind: its cgroups (under its cgroup root, and
    containerd's k8s.io), lo's addresses, the routes, the links, /var/lib/cni, the mounts and
    network namespaces of its folders, its CDI specs, its state and run folders. Equal before
    cluster-up and after cluster-down when cluster-down removed all it made."""
    hierarchies = sorted({line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                          if line.split()[2] in ("cgroup", "cgroup2") and line.split()[1].startswith("/sys/fs/cgroup")})
    cgroups = [os.path.join(root, d) for h in hierarchies for top in (CGROUP_ROOT, "k8s.io")
               for root, dirs, _ in os.walk(os.path.join(h, top)) for d in ["", *dirs]]
    ours = re.compile(rf"^({re.escape(PLUGIN_STATE)}|/var/lib/kubelet|{re.escape(str(STATE))}|{RUN_DIR}|"
                      r"/run/containerd|/var/run/netns|/run/netns)(/|$)")
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    cni = [os.path.join(root, f) for root, _, files in os.walk("/var/lib/cni") for f in files]
    netns = [*(os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])]
    return {
        "cgroups": sorted(cgroups),
        "lo addresses": _lines("ip", "-o", "addr", "show", "dev", "lo"),
        "routes": _lines("ip", "route", "show", "table", "all"),
        "links": sorted(line.split(":")[1].strip() for line in _lines("ip", "-o", "link")),
        "/var/lib/cni": sorted(cni) + (["/var/lib/cni"] if os.path.isdir("/var/lib/cni") else []),
        "mounts": sorted(m for m in mounts if ours.match(m)),
        "netns": sorted(netns),
        "cdi specs": cluster_specs(),
        "folders": [p for p in (str(STATE), RUN_DIR) if os.path.exists(p)],
    }


class Kube:
    """kubectl of the cluster's own release, with the cluster's admin kubeconfig."""

    def __init__(self, kubectl: str, kubeconfig: str, node: str):
        self.kubectl, self.kubeconfig, self.node = kubectl, kubeconfig, node
        self.install: subprocess.CompletedProcess[str] | None = None  # `kubectl apply -k` of the overlay
        # Set by the fixture that started the cluster (None when it found one running): the host's
        # traces of a cluster before cluster-up (host_traces) and the software it planted then.
        self.before: dict[str, list[str]] | None = None
        self.neighbours = None

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

    def wait_ready(self, *pods: str, timeout: int = 240, namespace: str = "default") -> None:
        """kubectl wait for the pods' Ready condition; on a timeout the failure says why each pod
        is not Ready (its conditions, containers' waiting reasons, its Events) and what the plugin
        logged last, so that a run that cannot be repeated still explains itself."""
        out = self.run("wait", "-n", namespace, "--for=condition=Ready", *(f"pod/{p}" for p in pods),
                       f"--timeout={timeout}s", check=False, timeout=timeout + 20)
        if out.returncode != 0:
            raise AssertionError(f"pods not Ready in {timeout}s: {out.stdout}{out.stderr}\n"
                                 + self.why_not_ready(pods, namespace))

    def why_not_ready(self, pods: tuple[str, ...], namespace: str) -> str:
        lines = []
        for pod in pods:
            got = self.run("get", "-n", namespace, "pod", pod, "-o", "json", check=False)
            if got.returncode != 0:
                lines.append(f"{pod}: {got.stderr.strip()}")
                continue
            status = json.loads(got.stdout).get("status", {})
            lines.append(f"{pod}: {status.get('phase')} on {status.get('hostIP')}")
            lines += [f"  condition {c['type']}={c['status']} {c.get('reason', '')} {c.get('message', '')}"
                      for c in status.get("conditions", []) if c.get("status") != "True"]
            lines += [f"  container {c['name']}: {state} {detail.get('reason', '')} {detail.get('message', '')}"
                      for c in status.get("containerStatuses", []) for state, detail in c.get("state", {}).items()
                      if state != "running"]
            events = self.run("get", "-n", namespace, "events", "--field-selector",
                              f"involvedObject.name={pod}", "-o",
                              "custom-columns=AT:.lastTimestamp,REASON:.reason,MESSAGE:.message",
                              "--no-headers", check=False)
            lines += [f"  event {e}" for e in events.stdout.splitlines()[-8:]]
        for plugin in plugin_pods(self):
            name = plugin["metadata"]["name"]
            logs = self.run("logs", "-n", NAMESPACE, name, "--tail=25", check=False)
            lines.append(f"plugin {name} ({plugin['status'].get('phase')}), last lines:")
            lines += [f"  {line[:400]}" for line in (logs.stdout + logs.stderr).splitlines()]
        return "\n".join(lines)

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


PROBE = '"$(gpushare-dra hook-path probe)"'


def examples(path: str, image: str = "gpushare-dra:dev") -> str:
    """A deploy/examples file, or every file of a folder, as YAML text for this cluster. No
    registry here serves the examples' CUDA image: their containers get the product's image
    (it has the probe and a shell), whose probe stands in for `nvidia-smi -L` (its `gpus` prints
    the same lines, as the playground's node does) and then prints what CUDA and NVML show
    (`meminfo`: cu_total is the memory the container got)."""
    where = REPO / "deploy" / "examples" / path
    files = sorted(where.glob("*.yaml")) if where.is_dir() else [where]
    docs = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    for doc in docs:
        spec = doc.get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if not c["image"].startswith("gpushare-dra"):
                c["image"] = image
                c["command"] = [part.replace("nvidia-smi -L", f"{PROBE} gpus && {PROBE} meminfo")
                                for part in c.get("command", [])]
    return yaml.safe_dump_all(docs)


def claim_spec(**requests: str) -> dict:
    """The spec of a claim for one gpushare.dev device with these capacity requests."""
    return {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpushare.dev", "capacity": {"requests": requests}}}]}}


def claim_manifest(name: str, **requests: str) -> str:
    """A ResourceClaim in default (YAML) asking one gpushare.dev device: claim_spec."""
    return yaml.safe_dump({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"name": name, "namespace": "default"}, "spec": claim_spec(**requests)})


def claim_template(name: str, memory: str = "1Gi", compute: str = "10") -> str:
    """A ResourceClaimTemplate in default (YAML) whose claims ask that memory and compute."""
    return yaml.safe_dump({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                           "metadata": {"name": name, "namespace": "default"},
                           "spec": {"spec": claim_spec(memory=memory, compute=compute)}})


CHART = "deploy/helm/gpushare-dra"
RELEASE = "gpushare-dra"
NAMESPACE = "gpushare-system"
HELM = REPO / "hack" / "helm"  # builds helm into .cache/tools once, prints its path


class Helm:
    """helm with the cluster's admin kubeconfig (hack/helm's build)."""

    def __init__(self, binary: str, kube: Kube):
        self.binary, self.kube = binary, kube

    def run(self, *args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
        cmd = [self.binary, f"--kubeconfig={self.kube.kubeconfig}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)

    def __call__(self, *args: str, timeout: float = 420) -> str:
        out = self.run(*args, timeout=timeout)
        assert out.returncode == 0, f"helm {' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
        return out.stdout


def plugin_pods(kube: Kube) -> list[dict]:
    return kube.items("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=gpushare-dra")


def without_kustomize_install(kube: Kube) -> None:
    """The kustomize install (tests/cluster/conftest.py `installed`) removed, for a Helm release
    of the same objects."""
    kube("delete", "-k", "deploy/overlays/mock", "--ignore-not-found", "--wait=true", timeout=300)
    kube.wait_until("the kustomize install's plugin pods to be gone", lambda: not plugin_pods(kube), timeout=180)


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
