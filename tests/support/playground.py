"""`gpushare-dra playground` as a user starts it (its own process, `--kubeconfig-out`), for
the e2e tests; containers run as host processes (`--runtime process`: fast, no podman)."""

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support import wait_for as support_wait_for
from tests.support.kubectl import Kubectl

NODE = "playground-node"
DEADLINE_S = 40  # a loaded machine; each wait takes a few seconds


@contextlib.contextmanager
def playground(work: Path, *flags: str):
    """(kubectl, the node's workdir) for a playground process on 2 x 80Gi simulated GPUs."""
    # The node's sockets are in its workdir and a unix socket's path has at most 107 bytes: under
    # pytest-xdist a test's tmp_path (.../popen-gw1/test_...) is too long for them.
    kubeconfig, node_dir = work / "playground.kubeconfig", Path(tempfile.mkdtemp(prefix="gspg"))
    # its log goes to a file: a pipe nobody reads while the tests run would fill and block it
    log = work / "playground.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "dra_driver.cli", "playground", "--port", "0",
                                 "--kubeconfig-out", str(kubeconfig), "--workdir", str(node_dir), "--runtime",
                                 "process", "--node-name", NODE, "--log-format", "json", *flags],
                                stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        deadline = time.monotonic() + 60  # imports and the plugin's start take seconds on a loaded machine
        while not kubeconfig.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert kubeconfig.exists(), f"the playground wrote no kubeconfig: {log.read_text()[-3000:]}"
        yield Kubectl(work, kubeconfig=kubeconfig), node_dir
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(node_dir, ignore_errors=True)


def wait_for(what: str, probe):
    """probe() until it returns something truthy, as long as a loaded machine may need."""
    return support_wait_for(probe, timeout=DEADLINE_S, interval=0.2, what=what)


@contextlib.contextmanager
def applied(kubectl, manifest: str):
    """The manifest applied for the block, deleted after it whatever happens."""
    kubectl("apply", "-f", "-", input=manifest)
    try:
        yield
    finally:
        kubectl("delete", "-f", "-", input=manifest)


def objects(kubectl, kind: str) -> list[dict]:
    return json.loads(kubectl("get", kind, "-o", "json"))["items"]


def pod_events(kubectl, pod: str, reason: str) -> list[str]:
    """The messages of the Events with this reason about the object named `pod`."""
    return [e["message"] for e in objects(kubectl, "events")
            if e["involvedObject"]["name"] == pod and e["reason"] == reason]


def prepared(node_dir: Path) -> set[str]:
    """Claim uids with a CDI spec or a claim folder on the node."""
    specs = {p.stem.split("_", 1)[1] for p in (node_dir / "cdi").glob("k8s.gpushare.dev-claim_*.json")}
    folders = {p.name for p in (node_dir / "state" / "claims").glob("*")}
    return specs | folders


def meminfo(log: str) -> dict[str, str]:
    """`gpushare-probe meminfo`'s key=value output (cu_total: cuMemGetInfo's total, the limit)."""
    return dict(item.split("=", 1) for line in log.splitlines() for item in line.split() if "=" in item)
