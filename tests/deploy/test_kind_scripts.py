"""hack/kind-up.sh and hack/e2e-kind.sh: they parse (bash -n, shellcheck where installed), and
kind-up's plan (--dry-run) per Kubernetes release: the pinned node image, and exactly the feature
gates the driver needs that the release has off by default (the emulator's model of upstream)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from playground.emulator.features import default_gates

ROOT = Path(__file__).parents[2]
SCRIPTS = [ROOT / "hack" / "kind-up.sh", ROOT / "hack" / "e2e-kind.sh"]
# What the driver uses: capacity mode, taints on unhealthy GPUs, pods without claims, health in pod status.
DRIVER_GATES = {"DRAConsumableCapacity", "DRADeviceTaints", "DRAExtendedResource", "ResourceHealthStatus"}


def plan(*args, **env):
    run = subprocess.run([str(SCRIPTS[0]), "--dry-run", *args], capture_output=True, text=True, timeout=30,
                         env={k: v for k, v in os.environ.items() if k not in ("KUBE_VERSION", "K8S_IMAGE")} | env)
    assert run.returncode == 0, run.stderr
    head, config = run.stdout.split("--- kind config\n")
    fields = dict(line.split(": ", 1) for line in head.splitlines())
    return fields, yaml.safe_load(config)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="no shellcheck (apt-get install shellcheck)")
def test_scripts_pass_shellcheck():
    run = subprocess.run(["shellcheck", *map(str, SCRIPTS)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


def test_default_is_137_with_no_gates():
    fields, config = plan()
    assert fields == {"cluster": "gpushare", "kube-version": "1.37", "feature-gates": "none",
                      "node-image": "kindest/node:v1.37.0@sha256:"
                                    "a1ed56cfb0e7b93589bdf97c8cd566405a265939e3620fc4f5de89adff580ae5"}
    assert "featureGates" not in config and "runtimeConfig" not in config
    assert [n["role"] for n in config["nodes"]] == ["control-plane", "worker"]
    assert "enable_cdi = true" in config["containerdConfigPatches"][0]


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_gates_are_those_the_release_has_off(version):
    fields, config = plan("--kube-version", version, "mine")
    needed = {g for g in DRIVER_GATES if not default_gates(version)[g]}
    assert set(config.get("featureGates") or {}) == needed
    assert all(config.get("featureGates", {}).values())
    assert fields["kube-version"] == version and fields["cluster"] == "mine"
    image, digest = fields["node-image"].split("@sha256:")
    assert image.startswith(f"kindest/node:v{version}.") and len(digest) == 64  # pinned by digest


def test_environment_picks_the_version_and_the_flag_wins():
    assert plan(KUBE_VERSION="1.35")[0]["kube-version"] == "1.35"
    assert plan("--kube-version=1.36", KUBE_VERSION="1.35")[0]["kube-version"] == "1.36"
    assert plan(K8S_IMAGE="kindest/node:v1.36.2")[0]["node-image"] == "kindest/node:v1.36.2"


def test_unsupported_version_is_one_clear_error():
    run = subprocess.run([str(SCRIPTS[0]), "--dry-run", "--kube-version", "1.33"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == "kind-up: --kube-version: '1.33' is not supported (accepted: 1.34, 1.35, 1.36, 1.37)\n"
