"""What the admission policies know of the cluster, on the driver's DeviceClass.

The largest GPU's memory, for the admission policy gpushare.dev-requests: each node's
controller writes its largest published GPU into the annotation gpushare.dev/largest-gpu-memory
of the driver's DeviceClass (named like the driver: gpushare.dev) when that is more than the
annotation says, so the policy refuses at apply time a memory ask no GPU of the cluster holds
(deploy/base/admission-requests.yaml reads the class as its param).

The value only grows: every node raises it to its own largest, none lowers it (a node cannot
know the others'); an operator who removes nodes of larger GPUs deletes the annotation and the
plugins write it again (each node looks every 10 minutes, and whenever its GPUs change).
Writes are optimistic (the class's resourceVersion): two nodes raising it at once both land,
the larger last. A class that does not exist, or RBAC that does not let
the plugin patch it, is logged (at most every 10 minutes): the policy then keeps its constant.

Whether the API server keeps capacity requests (CAPACITY_ANNOTATION), for
gpushare.dev-requests-warnings: on 1.34/1.35 without the DRAConsumableCapacity gate the server
drops a claim's `capacity` before admission, so the policy cannot see it; it warns instead about
a plain request (no count) to gpushare.dev on such a cluster, which gets one partition share.

The sharing modes the nodes publish (MODES_ANNOTATION, `capacity`, `partition` or both,
comma-separated), for gpushare.dev-pod-warnings: a pod asking `gpushare.dev/share` (partition
mode's extended resource) on a cluster whose nodes all publish capacity devices, or
`gpushare.dev/gpu` where they all publish partition devices, stays Pending; the policy says so at
apply time. Each node adds its mode when missing; like the memory, the list only grows (delete
the annotation after switching every node's mode, and the plugins write it again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kubernetes import client

from ..devicemodel import MEMORY_STEP
from ..discovery import GpuInfo
from ..kube import JSON, api_error, json_body, plain
from ..log import get_logger
from ..quantity import QuantityError, format_bytes, parse_bytes
from .slices import publishable

ANNOTATION = "gpushare.dev/largest-gpu-memory"
# "false" where the API server drops capacity requests (no DRAConsumableCapacity: 1.34 and 1.35
# without the gate), "true" where it keeps them: gpushare.dev-requests-warnings tells the author.
CAPACITY_ANNOTATION = "gpushare.dev/consumable-capacity"
MODES_ANNOTATION = "gpushare.dev/sharing-modes"
REQUEST_TIMEOUT = (5, 30)
MERGE_PATCH = "application/merge-patch+json"  # resourceVersion in it: the write is conditional
ATTEMPTS = 5  # conflicts in a row before giving up until the next change
RECHECK_S = 600.0  # an unchanged node looks again this often (an operator reset the annotation)
RETRY_S = 60.0  # after a failure

log = get_logger("gpushare.controller")


def largest(gpus: list[GpuInfo]) -> int | None:
    """The most memory a capacity-mode request can ask of one of these GPUs (the published
    validRange max: rounded down to the 256Mi step), None without a publishable GPU."""
    sizes = [g.memory_bytes // MEMORY_STEP * MEMORY_STEP for g in gpus if publishable(g)]
    return max(sizes) if sizes else None


def written(device_class: JSON) -> int | None:
    """What the class's annotation says, None when absent or not a quantity."""
    value = ((device_class.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    try:
        return parse_bytes(value, ANNOTATION) if isinstance(value, str) else None
    except QuantityError:
        return None


class MemoryCeiling:
    """Raises the DeviceClass's annotation to this node's largest GPU, once per change."""

    def __init__(self, api_client: client.ApiClient, class_name: str, node: str,
                 clock: Callable[[], float] = time.monotonic):
        self._api = client.ResourceV1Api(api_client)
        self.class_name, self.node, self.clock = class_name, node, clock
        self._size: tuple[int, bool | None, str | None] | None = None  # what was last looked at, and when to look again
        self._next = 0.0

    def raise_to(self, gpus: list[GpuInfo], capacity_kept: bool | None = None, mode: str | None = None) -> None:
        """Look now if this node's largest GPU (or what the API server does with capacity
        requests, or the node's sharing mode) changed or a look is due; raise the memory
        annotation when it is below, set CAPACITY_ANNOTATION when it differs, add `mode` to
        MODES_ANNOTATION when missing. A failure is raised (the caller logs it) and looked at
        again in a minute."""
        size = largest(gpus)
        if size is None:
            return
        state = (size, capacity_kept, mode)
        if state == self._size and self.clock() < self._next:
            return
        self._size, self._next = state, self.clock() + RETRY_S
        for _ in range(ATTEMPTS):
            try:
                current = json_body(self._api.read_device_class(self.class_name, _preload_content=False,
                                                                _request_timeout=REQUEST_TIMEOUT))
                annotations = (current.get("metadata") or {}).get("annotations") or {}
                changes = {}
                if (written(current) or 0) < size:
                    changes[ANNOTATION] = format_bytes(size)
                if capacity_kept is not None and annotations.get(CAPACITY_ANNOTATION) != str(capacity_kept).lower():
                    changes[CAPACITY_ANNOTATION] = str(capacity_kept).lower()
                modes = [m for m in annotations.get(MODES_ANNOTATION, "").split(",") if m]
                if mode is not None and mode not in modes:
                    changes[MODES_ANNOTATION] = ",".join(sorted([*modes, mode]))
                if changes:
                    patch = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"],
                                          "annotations": changes}}
                    self._api.patch_device_class(self.class_name, plain(patch), _content_type=MERGE_PATCH,
                                                 _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
                    log.info("published for admission", device_class=self.class_name, annotations=changes,
                             node=self.node)
                self._next = self.clock() + RECHECK_S
                return
            except client.ApiException as e:
                if e.status == 409:  # another node raised it meanwhile: read again
                    continue
                if e.status in (403, 404):  # no class, or RBAC without the rule: the policy's constant stands
                    log.info("cannot publish the largest GPU's memory for admission; the policy keeps its "
                             "constant", device_class=self.class_name, error=api_error(e))
                    self._next = self.clock() + RECHECK_S
                    return
                raise
        log.warning("largest GPU memory not published: the DeviceClass kept changing",
                    device_class=self.class_name, attempts=ATTEMPTS)
