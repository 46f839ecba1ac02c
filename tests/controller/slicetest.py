"""Fixtures and helpers of the controller tests.

A uniquely named module imported by each test file, not a conftest.py: other test folders
import helpers with `from conftest import ...`, and a second module named `conftest` would
shadow theirs depending on collection order.
"""

from __future__ import annotations

import time

import pytest
import yaml
from kubernetes import client

from dra_driver.controller import Backoff, SliceController
from dra_driver.discovery import MockBackend
from dra_driver.playground.emulator import ApiEmulator

DRIVER = "gpushare.dev"
NODE = "node-a"


def wait_until(predicate, timeout=5.0, interval=0.02):
    """Poll predicate until it is truthy; its last value (falsy on timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


class Gpus:
    """Mock GPUs in a YAML file the backend re-reads: tests edit it to change the node."""

    def __init__(self, path, count=2, memory="80Gi"):
        self.path = path
        self.entries = [{"index": i, "memory": memory} for i in range(count)]
        self.write()

    def write(self):
        self.path.write_text(yaml.safe_dump({"gpus": self.entries}))

    def set(self, index, **fields):
        for e in self.entries:
            if e["index"] == index:
                e.update(fields)
        self.write()

    def remove(self, index):
        self.entries = [e for e in self.entries if e["index"] != index]
        self.write()

    def backend(self):
        return MockBackend(str(self.path))


@pytest.fixture
def emulator():
    emu = ApiEmulator(consumable_capacity=True, device_taints=True).start()
    yield emu
    emu.stop()


@pytest.fixture
def make_emulator():
    started = []

    def make(**kwargs):
        emu = ApiEmulator(**kwargs).start()
        started.append(emu)
        return emu

    yield make
    for emu in started:
        emu.stop()


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


def slices_of(emu, node=NODE, driver=DRIVER) -> list[dict]:
    """The pool's slices as the server stores them (plain dicts, sorted by name)."""
    api = client.ResourceV1Api(emu.api_client())
    resp = api.list_resource_slice(field_selector=f"spec.driver={driver},spec.nodeName={node}",
                                   _preload_content=False)
    import json

    return sorted(json.loads(resp.data)["items"], key=lambda s: s["metadata"]["name"])


def devices_of(emu, node=NODE) -> dict[str, dict]:
    return {d["name"]: d for s in slices_of(emu, node) for d in s["spec"].get("devices") or []}


def generations(emu, node=NODE) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in slices_of(emu, node)}


def create_node(emu, name=NODE) -> str:
    node = client.CoreV1Api(emu.api_client()).create_node({"apiVersion": "v1", "kind": "Node",
                                                           "metadata": {"name": name}})
    return node.metadata.uid
