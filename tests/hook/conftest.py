"""Fixtures of the enforcement library's tests: the builds (made once) and claims laid out in
the test's folder; the helpers are in tests/support/hook.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import MiB
from tests.support.hook import HOOK, make_hook, new_claim


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
        return new_claim(tmp_path, build, gpus or [{"memory": memory, "compute": compute}], name, sim)

    return make

