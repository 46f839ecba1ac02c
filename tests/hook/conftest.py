"""Fixtures of the enforcement library's tests: the builds (made once) and claims laid out in
the test's folder; the helpers are in tests/support/hook.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubeletplugin.hooklayout import REGION_SIZE
from tests.support import MiB
from tests.support.hook import HOOK, Claim, make_hook, write_limits


@pytest.fixture(scope="session")
def build() -> Path:
    make_hook()
    return HOOK / "build"


@pytest.fixture(scope="session")
def asan_build() -> Path:
    make_hook("asan")
    return HOOK / "build-asan"


@pytest.fixture
def make_claim(build, tmp_path):
    """make_claim(memory=..., compute=..., gpus=[...], sim={...}) -> Claim"""

    def make(memory=64 * MiB, compute=100, gpus=None, sim=None, name="claim"):
        root = tmp_path / name
        (root / "region").mkdir(parents=True)
        gpus = gpus or [{"memory": memory, "compute": compute}]
        write_limits(root / "limits", gpus)
        for i in range(len(gpus)):
            with open(root / "region" / str(i), "wb") as f:
                f.truncate(REGION_SIZE)  # as the kubelet plugin creates it
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
        env.update({
            "GPUSHARE_RUN_DIR": str(root),
            "GPUSHARE_SIM_STATE": str(tmp_path / "sim.state"),
            "LD_LIBRARY_PATH": str(build / "sim"),
        })
        env.update(sim or {})
        return Claim(root, build, env)

    return make

