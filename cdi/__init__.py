"""Container Device Interface: the spec model, atomic spec files, and other vendors' specs."""

from .atomic import fsync_dir, remove_durable, remove_temp_files, write_atomic
from .spec import ContainerEdits, Device, DeviceNode, Mount, Spec
from .store import SpecDir, find_devices_of_kind

__all__ = [
    "ContainerEdits", "Device", "DeviceNode", "Mount", "Spec", "SpecDir", "find_devices_of_kind",
    "fsync_dir", "remove_durable", "remove_temp_files", "write_atomic",
]
