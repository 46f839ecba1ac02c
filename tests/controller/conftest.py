"""Fixtures of the controller tests (each test gets a fresh `emulator`, from tests/conftest.py);
the helpers are in tests/support/slices.py."""

from __future__ import annotations

import pytest

from dra_driver.controller import Backoff, SliceController
from playground.claims import DRIVER, NODE
from tests.support.slices import Gpus


@pytest.fixture
def gpus(tmp_path):
    return Gpus(tmp_path / "gpus.yaml")


@pytest.fixture
def controllers():
    """make(emu, backend, **kwargs): a started controller, stopped after the test."""
    started = []

    def make(emu, backend, node=NODE, driver=DRIVER, start=True, **kwargs):
        kwargs.setdefault("gpu_poll_interval", 0.2)
        ctrl = SliceController(emu.api_client(), driver, node, backend, **kwargs)
        ctrl.backoff = Backoff(0.05, 0.25)  # quick retries keep the tests short
        started.append(ctrl)
        if start:
            ctrl.start()
        return ctrl

    yield make
    for ctrl in started:
        ctrl.stop()
