"""`gpushare-dra playground` as a user starts it (its own process, `--kubeconfig-out`), for
the e2e tests; containers run as host processes (`--runtime process`: fast, no podman)."""

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

from tests.support.kubectl import Kubectl

NODE = "playground-node"
DEADLINE_S = 40  # a loaded machine; each wait takes a few seconds


@contextlib.contextmanager
def playground(work: Path, *flags: str):
    """(kubectl, the node's workdir) for a playground process on 2 x 80Gi simulated GPUs."""
    kubeconfig, node_dir = work / "playground.kubeconfig", work / "node"
    proc = subprocess.Popen([sys.executable, "-m", "dra_driver.cli", "playground", "--port", "0",
                             "--kubeconfig-out", str(kubeconfig), "--workdir", str(node_dir), "--runtime", "process",
                             "--node-name", NODE, "--log-format", "json", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # imports and the plugin's start take seconds on a loaded machine
        while not kubeconfig.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert kubeconfig.exists(), f"the playground wrote no kubeconfig: {proc.stderr.read() if proc.poll() else ''}"
        yield Kubectl(work, kubeconfig=kubeconfig), node_dir
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def wait_for(what: str, probe):
    """probe() until it returns something truthy; fails naming `what` and the last value."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            assert value, f"{what}: not after {DEADLINE_S}s"
            return value
        time.sleep(0.2)


def objects(kubectl, kind: str) -> list[dict]:
    return json.loads(kubectl("get", kind, "-o", "json"))["items"]


def prepared(node_dir: Path) -> set[str]:
    """Claim uids with a CDI spec or a claim folder on the node."""
    specs = {p.stem.split("_", 1)[1] for p in (node_dir / "cdi").glob("k8s.gpushare.dev-claim_*.json")}
    folders = {p.name for p in (node_dir / "state" / "claims").glob("*")}
    return specs | folders


def meminfo(log: str) -> dict[str, str]:
    """`gpushare-probe meminfo`'s key=value output (cu_total: cuMemGetInfo's total, the limit)."""
    return dict(item.split("=", 1) for line in log.splitlines() for item in line.split() if "=" in item)
