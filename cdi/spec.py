"""The CDI spec model (container-device-interface SPEC.md), only the parts we write.

`Spec.to_dict()` gives the JSON document; `cdiVersion` is the lowest version whose
features the spec uses, so older runtimes (podman 4.3 reads up to 0.5.0) accept it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NotRequired, TypedDict


# The JSON documents, as the CDI schema names their fields.
class MountDoc(TypedDict):
    hostPath: str
    containerPath: str
    options: NotRequired[list[str]]
    type: NotRequired[str]


class DeviceNodeDoc(TypedDict):
    path: str
    hostPath: NotRequired[str]
    permissions: NotRequired[str]


class ContainerEditsDoc(TypedDict, total=False):
    env: list[str]
    deviceNodes: list[DeviceNodeDoc]
    mounts: list[MountDoc]


class DeviceDoc(TypedDict):
    name: str
    containerEdits: ContainerEditsDoc


class SpecDoc(TypedDict):
    cdiVersion: str
    kind: str
    devices: list[DeviceDoc]
    containerEdits: NotRequired[ContainerEditsDoc]


@dataclass
class Mount:
    host_path: str
    container_path: str
    options: list[str] = field(default_factory=list)
    type: str = ""  # needs cdiVersion 0.4.0

    def to_dict(self) -> MountDoc:
        d: MountDoc = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            d["options"] = list(self.options)
        if self.type:
            d["type"] = self.type
        return d


@dataclass
class DeviceNode:
    path: str
    host_path: str = ""  # needs cdiVersion 0.5.0
    permissions: str = ""

    def to_dict(self) -> DeviceNodeDoc:
        d: DeviceNodeDoc = {"path": self.path}
        if self.host_path:
            d["hostPath"] = self.host_path
        if self.permissions:
            d["permissions"] = self.permissions
        return d


@dataclass
class ContainerEdits:
    env: list[str] = field(default_factory=list)  # "NAME=value"
    mounts: list[Mount] = field(default_factory=list)
    device_nodes: list[DeviceNode] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.env or self.mounts or self.device_nodes)

    def to_dict(self) -> ContainerEditsDoc:
        d: ContainerEditsDoc = {}
        if self.env:
            d["env"] = list(self.env)
        if self.device_nodes:
            d["deviceNodes"] = [n.to_dict() for n in self.device_nodes]
        if self.mounts:
            d["mounts"] = [m.to_dict() for m in self.mounts]
        return d


@dataclass
class Device:
    name: str
    edits: ContainerEdits


@dataclass
class Spec:
    kind: str  # vendor.com/class
    devices: list[Device]
    edits: ContainerEdits = field(default_factory=ContainerEdits)  # applied once per container

    def device_id(self, name: str) -> str:
        """The fully qualified device ID a runtime is asked for: kind=name."""
        return f"{self.kind}={name}"

    def required_version(self) -> str:
        """The lowest cdiVersion that has every feature this spec uses."""
        all_edits = [self.edits, *(d.edits for d in self.devices)]
        if "." in self.kind.partition("/")[2]:
            return "0.6.0"  # dots in the class part of the kind
        if any(d.name[:1] and not d.name[0].isalpha() for d in self.devices):
            return "0.5.0"  # device names starting with a digit (claim UIDs often do)
        if any(n.host_path for e in all_edits for n in e.device_nodes):
            return "0.5.0"
        if any(m.type for e in all_edits for m in e.mounts):
            return "0.4.0"
        return "0.3.0"

    def to_dict(self) -> SpecDoc:
        d: SpecDoc = {
            "cdiVersion": self.required_version(),
            "kind": self.kind,
            "devices": [{"name": dev.name, "containerEdits": dev.edits.to_dict()} for dev in self.devices],
        }
        if not self.edits.is_empty():
            d["containerEdits"] = self.edits.to_dict()
        return d
