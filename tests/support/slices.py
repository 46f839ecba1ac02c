"""Helpers of the controller tests: mock GPUs the tests edit, and the pool's slices as the
API server stores them. The fixtures are in tests/controller/conftest.py."""

from __future__ import annotations

import json

import yaml
from kubernetes import client

from dra_driver.discovery import MockBackend
from playground.claims import DRIVER, NODE


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


def slices_of(emu, node=NODE, driver=DRIVER) -> list[dict]:
    """The pool's slices as the server stores them (plain dicts, sorted by name)."""
    api = client.ResourceV1Api(emu.api_client())
    resp = api.list_resource_slice(field_selector=f"spec.driver={driver},spec.nodeName={node}",
                                   _preload_content=False)
    return sorted(json.loads(resp.data)["items"], key=lambda s: s["metadata"]["name"])


def devices_of(emu, node=NODE) -> dict[str, dict]:
    return {d["name"]: d for s in slices_of(emu, node) for d in s["spec"].get("devices") or []}


def generations(emu, node=NODE) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in slices_of(emu, node)}


def create_node(emu, name=NODE) -> str:
    node = client.CoreV1Api(emu.api_client()).create_node({"apiVersion": "v1", "kind": "Node",
                                                           "metadata": {"name": name}})
    return node.metadata.uid
