"""SliceController: keeps the API server's ResourceSlices of (driver, pool = node) true.

Two threads:
- the reconcile loop rediscovers GPUs every `gpu_poll_interval` and, when the desired
  slices changed or the watch saw our pool change, lists the pool and writes the
  difference (create / update / delete, one new pool generation for all slices);
- the watch (`SliceWatch`) follows resourceslices of the driver and wakes the loop on any
  event for this node's pool, so a slice deleted or edited by someone else is restored at
  once.

In steady state nothing is requested at all except the watch itself: the loop only lists
when something may have changed, and only writes when the list differs from the desired
slices (compared semantically, see slices.content).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from kubernetes import client, watch

from .. import devicemodel
from ..config.strategies import GpuStrategies
from ..discovery import DeviceBackend, DiscoveryError, GpuInfo
from ..kube import JSON, api_deadline, api_error, json_body, no_request_retries, plain, warning_event
from ..log import get_logger
from ..mig import NO_MIG, GpuSet
from . import slices
from .ceiling import MemoryCeiling
from .pending import PendingClaims

MODES = ("auto", devicemodel.CAPACITY, devicemodel.PARTITION)
REQUEST_TIMEOUT = (5, 30)  # (connect, read) seconds: a hung server never blocks the loop
# One pass of the loop, all its requests together (api_deadline): REQUEST_TIMEOUT bounds each
# read, and a server that trickles its answers never trips it.
PASS_TIMEOUT_S = 60
NODE_RETRY_S = 60.0  # a missing Node is looked up again this often (for the ownerReference)
MIN_WATCH_SECONDS = 1.0  # a watch ending sooner than this is treated as a failure (backoff)
WATCH_SECONDS = (240, 360)  # server-side watch timeout, randomised so many nodes do not re-watch together
EVENT_NAMESPACE = "default"  # Node events live in "default", as the kubelet's do
COMPONENT = "gpushare-dra-controller"

log = get_logger("gpushare.controller")


class Backoff:
    """Exponential backoff with jitter: each delay is uniform in [d/2, d], d doubling to `cap`."""

    def __init__(self, initial: float = 0.5, cap: float = 30.0):
        self.initial, self.cap = initial, cap
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self._next = self.initial


class SliceWatch:
    """One watch on the ResourceSlices a field selector picks: `changed(pool name)` for every
    event, `changed(None)` after each (re-)list, when anything may have changed."""

    def __init__(self, api_client: client.ApiClient, selector: str, changed: Callable[[str | None], None]):
        self._api = client.ResourceV1Api(api_client)
        self._selector = selector
        self._changed = changed
        self._stopped = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self.backoff = Backoff()

    def start(self) -> SliceWatch:
        self._thread = threading.Thread(target=self._run, name=f"slice-watch[{self._selector}]", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._watch:
            self._watch.stop()  # type: ignore[no-untyped-call]
        if self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        resource_version = None
        while not self._stopped.is_set():
            try:
                if resource_version is None:
                    # (Re-)list for a resourceVersion to watch from; anything may have changed
                    # while we were not watching, so the pool takes a fresh look. From the API
                    # server's cache ("0", as an informer's list): a consistent list asks etcd
                    # first, and when the cache lags it lists every slice from etcd (below).
                    listed = json_body(self._api.list_resource_slice(field_selector=self._selector, limit=1,
                                                                     resource_version="0", _preload_content=False,
                                                                     _request_timeout=REQUEST_TIMEOUT))
                    resource_version = listed["metadata"]["resourceVersion"]
                    self._changed(None)
                self._watch = watch.Watch(return_type="object")  # type: ignore[no-untyped-call] # plain dicts
                timeout = random.randint(*WATCH_SECONDS)
                opened = time.monotonic()
                for event in self._watch.stream(  # type: ignore[no-untyped-call]
                        self._api.list_resource_slice, field_selector=self._selector,
                        resource_version=resource_version, allow_watch_bookmarks=True, timeout_seconds=timeout,
                        _request_timeout=(REQUEST_TIMEOUT[0], timeout + 30)):
                    resource_version = self._watch.resource_version or resource_version
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        pool = ((event["raw_object"].get("spec") or {}).get("pool") or {}).get("name")
                        self._changed(pool)
                    if self._stopped.is_set():
                        return
                if self._stopped.is_set():
                    return
                if time.monotonic() - opened < MIN_WATCH_SECONDS:
                    self._pause("the server ended the watch right away")  # a struggling server: no hammering
                else:
                    self.backoff.reset()
            except client.ApiException as e:
                if e.status == 410:  # our resourceVersion is too old: re-list, no need to wait
                    log.info("slice watch expired, re-listing", selector=self._selector)
                    resource_version = None
                    continue
                self._pause(api_error(e))
            except Exception as e:  # connection refused, reset, timeouts: the server comes back
                if self._stopped.is_set():
                    return
                self._pause(f"{type(e).__name__}: {e}")

    def _pause(self, error: str) -> None:
        delay = self.backoff.next()
        log.warning("slice watch failed, retrying", selector=self._selector, error=error, retry_in=round(delay, 2))
        self._stopped.wait(delay)


class SliceController:
    """Publishes one node's GPUs as ResourceSlices and keeps them true (see module doc)."""

    def __init__(self, api_client: client.ApiClient, driver_name: str, node_name: str, backend: DeviceBackend,
                 sharing_mode: str = "auto", partitions: int = 8, gpu_poll_interval: float = 5.0,
                 *, taint_effect: str = slices.TAINT_EFFECT, device_order: str = devicemodel.BINPACK,
                 strategies: GpuStrategies | None = None, mig_gpus: GpuSet = NO_MIG):
        if sharing_mode not in MODES:
            raise ValueError(f"sharing_mode: {sharing_mode!r} is not one of {', '.join(MODES)}")
        if device_order not in devicemodel.DEVICE_ORDERS:
            raise ValueError(f"device_order: {device_order!r} is not one of {', '.join(devicemodel.DEVICE_ORDERS)}")
        if not 1 <= partitions <= slices.MAX_DEVICES:
            raise ValueError(f"partitions: {partitions} is out of range 1..{slices.MAX_DEVICES}")
        self.driver, self.node, self.backend = driver_name, node_name, backend
        self.sharing_mode, self.partitions, self.gpu_poll_interval = sharing_mode, partitions, gpu_poll_interval
        self.taint_effect = taint_effect  # of an unhealthy GPU's devices: NoSchedule or NoExecute
        self.device_order = device_order  # binpack or spread: the order the scheduler tries devices in
        self.strategies = strategies or GpuStrategies()  # what each GPU serves (its sharingStrategy attribute)
        self.mig_gpus = mig_gpus  # GPUs offered as MIG devices when in MIG mode (docs/mig.md)
        no_request_retries(api_client)  # the loop retries with backoff; api_deadline bounds each pass
        self._api = client.ResourceV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._wake = threading.Event()
        self._watch = SliceWatch(api_client, f"spec.driver={driver_name},spec.nodeName={node_name}",
                                 self._slices_changed)
        # The admission policy's largest GPU (ceiling.py): the DeviceClass named like the driver.
        self._ceiling = MemoryCeiling(api_client, driver_name, node_name)
        # NoGpuFits Events on claims no GPU can hold now (pending.py): from one node per cluster.
        self._pending = PendingClaims(api_client, driver_name, node_name)
        self._rediscover_asked = threading.Event()
        self._stopped = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self.backoff = Backoff()
        self.log = log.bind(node=node_name, driver=driver_name)
        # Learned from the server; None until the first pass asks.
        self._capacity_kept: bool | None = None
        self._taints_kept: bool | None = None
        self._counters_kept = True  # partitionable devices' fields; False once a write lost them
        self._node_uid: str | None = None
        self._node_checked_at = 0.0
        self._node_checked = False
        self._fallback_reported = False
        self._gpus: list[GpuInfo] | None = None
        self._generation = 0  # highest pool generation we know of; never goes back
        self._seen_rv: str | None = None  # the newest resourceVersion of our lists and writes

    # --- public API -------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """The sharing mode in effect: "capacity" or "partition" ("auto" until the server was asked)."""
        if self.sharing_mode != "auto":
            return self.sharing_mode
        if self._capacity_kept is None:
            return "auto"
        return devicemodel.CAPACITY if self._capacity_kept else devicemodel.PARTITION

    def start(self) -> SliceController:
        self._watch.start()
        self._thread = threading.Thread(target=self._run, name=f"slices[{self.node}]", daemon=True)
        self._thread.start()
        self._pending.start()
        return self

    def rediscover_now(self) -> None:
        """Read the GPUs again without waiting for the next poll (a GPU's health changed)."""
        self._rediscover_asked.set()
        self._wake.set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        """True once the server's slices equal the desired ones (False on timeout)."""
        return self._synced.wait(timeout)

    def stop(self) -> None:
        """Stop the threads. The slices stay: a restarting plugin must not make pods unschedulable."""
        self._stopped.set()
        self._wake.set()
        self._watch.stop()
        self._pending.stop()
        if self._thread:
            self._thread.join(timeout=10)

    # --- the loop -----------------------------------------------------------------------------

    def _slices_changed(self, pool: str | None) -> None:
        """The watch saw our pool change (None: it re-listed, anything may have): take a look."""
        if pool is None or pool == self.node:
            self._wake.set()

    def _run(self) -> None:
        next_poll = 0.0
        dirty = True  # the first pass always looks
        while not self._stopped.is_set():
            if time.monotonic() >= next_poll or self._rediscover_asked.is_set():
                self._rediscover_asked.clear()
                dirty |= self._rediscover()
                dirty |= self._node_lookup_due()
                next_poll = time.monotonic() + self.gpu_poll_interval
            # Never publish before the GPUs were read once: an empty pool would unschedule the node.
            if self._gpus is not None and (dirty or self._wake.is_set()):
                self._wake.clear()
                try:
                    with api_deadline(PASS_TIMEOUT_S):
                        self._reconcile()
                    dirty = False
                    self.backoff.reset()
                except Exception as e:  # every failure waits: never a tight loop against the server
                    self._synced.clear()
                    dirty = True
                    delay = self.backoff.next()
                    self.log.warning("publishing slices failed, retrying", error=_describe(e),
                                     retry_in=round(delay, 2))
                    self._stopped.wait(delay)
                    continue
            if self._synced.is_set():
                self._raise_ceiling()  # returns at once unless the GPUs changed or a recheck is due
            if self._gpus is None:  # discovery failing at start: just wait for the next poll
                self._stopped.wait(max(0.0, next_poll - time.monotonic()))
            else:
                self._wake.wait(max(0.0, next_poll - time.monotonic()))

    def _raise_ceiling(self) -> None:
        """Publish this node's largest GPU for admission (once per change); a failure is logged
        and tried again after the next change or pass, never holding up the slices."""
        try:
            with api_deadline(PASS_TIMEOUT_S):
                mode = None if self.mode == "auto" else self.mode
                self._ceiling.raise_to(self._gpus or [], self._capacity_kept, mode)
        except Exception as e:
            self.log.warning("publishing the largest GPU's memory for admission failed", error=_describe(e))

    def _rediscover(self) -> bool:
        """Read the GPUs again; True when they differ from the last reading."""
        try:
            gpus = self.backend.discover()
        except DiscoveryError as e:  # keep publishing what we knew; NVML hiccups are transient
            self.log.warning("GPU discovery failed, keeping the last known GPUs", error=str(e))
            return False
        if gpus == self._gpus:
            return False
        if self._gpus is not None:
            self.log.info("GPUs changed", gpus=len(gpus), unhealthy=[g.index for g in gpus if not g.healthy])
        self._gpus = gpus
        return True

    def desired(self) -> list[JSON]:
        """The slices this node should have now (generation 0; the pass sets the real one)."""
        mode = self.mode
        # MIG devices only where the server keeps their counters: without them the scheduler would
        # book overlapping instances (feature gate DRAPartitionableDevices off)
        mig_gpus = self.mig_gpus if self._counters_kept else NO_MIG
        devices = slices.desired_devices(self._gpus or [], mode, self.partitions, bool(self._taints_kept),
                                         self.taint_effect, self.device_order, self.strategies, mig_gpus)
        if mode == devicemodel.CAPACITY and not self._capacity_kept:
            # Capacity mode forced on a server without the gate: publish what it will store,
            # or every comparison would differ and we would rewrite forever.
            for d in devices:
                d.pop("allowMultipleAllocations", None)
                for c in d["capacity"].values():
                    c.pop("requestPolicy", None)
        return slices.desired_slices(self.node, self.driver, devices, self._node_uid,
                                     slices.mig_counter_sets(self._gpus or [], mig_gpus))

    def _reconcile(self) -> None:
        if not self._node_checked:
            self._look_up_node()
        if self._capacity_kept is None:
            self._probe_server()
        desired = self.desired()
        actual = self._list_pool()
        self._generation = max([self._generation] + [slices.generation(s) for s in actual])
        if slices.in_sync(desired, actual):
            self._synced.set()
            return
        self._synced.clear()
        self._publish(desired, actual)
        self._synced.set()

    def _publish(self, desired: list[JSON], actual: list[JSON]) -> None:
        generation = self._generation + 1
        by_name = {s["metadata"]["name"]: s for s in actual}
        wanted = {s["metadata"]["name"] for s in desired}
        self.log.info("publishing slices", generation=generation, slices=len(desired),
                      devices=sum(len(s["spec"].get("devices") or []) for s in desired), mode=self.mode)
        for want in desired:
            body = slices.with_generation(want, generation)
            name = body["metadata"]["name"]
            if name in by_name:
                body["metadata"]["resourceVersion"] = by_name[name]["metadata"]["resourceVersion"]
                answer = self._api.replace_resource_slice(name, plain(body), _preload_content=False,
                                                          _request_timeout=REQUEST_TIMEOUT)
            else:
                answer = self._api.create_resource_slice(plain(body), _preload_content=False,
                                                         _request_timeout=REQUEST_TIMEOUT)
            self._generation = generation  # written once: never hand this number out again
            returned = json_body(answer)
            self._saw(returned["metadata"].get("resourceVersion"))
            self._learn(body, returned)
        for name, old in by_name.items():
            if name not in wanted:
                try:
                    self._api.delete_resource_slice(
                        name, body=plain({"preconditions": {"uid": old["metadata"]["uid"]}}),
                        _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
                except client.ApiException as e:
                    if e.status != 404:  # already gone is what we wanted
                        raise

    def _list_pool(self) -> list[JSON]:
        """This node's slices of our driver, from the API server's watch cache, no older than our
        last list or write (the cache's newest at the first list). Not a consistent list: that asks
        etcd for its revision and waits for the cache to reach it, and where the cache lags (a
        busy server) it lists from etcd, which has no index on the node: every slice of the fleet
        read for one node's. At 1,000 nodes those lists took 15 to 30 s each and the fleet never
        finished publishing (docs/fleet.md). A stale answer costs a 409 and a retry, never a
        wrong slice: every write is conditional (create by name, replace by resourceVersion)."""
        selector = f"spec.driver={self.driver},spec.nodeName={self.node}"
        listed = json_body(self._api.list_resource_slice(
            field_selector=selector, resource_version=self._seen_rv or "0",
            resource_version_match="NotOlderThan" if self._seen_rv else None, _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT))
        self._saw(listed["metadata"].get("resourceVersion"))
        return [s for s in listed.get("items") or [] if (s["spec"].get("pool") or {}).get("name") == self.node]

    def _saw(self, resource_version: str | None) -> None:
        """Remember the newer of two resourceVersions (etcd revisions: numbers in practice; an
        opaque one is taken as newer)."""
        if not resource_version:
            return
        if self._seen_rv and self._seen_rv.isdigit() and resource_version.isdigit() \
                and int(resource_version) < int(self._seen_rv):
            return
        self._seen_rv = resource_version

    # --- what the server keeps ------------------------------------------------------------

    def _probe_server(self) -> None:
        """Ask (dryRun=All) whether the server keeps consumable-capacity fields and device taints."""
        probe = slices.probe_slice(self.node, self.driver)
        try:
            returned = json_body(self._api.create_resource_slice(plain(probe), dry_run="All", _preload_content=False,
                                                                 _request_timeout=REQUEST_TIMEOUT))
        except client.ApiException as e:
            if e.status in (409, 429) or e.status >= 500 or e.status == 0:
                raise  # transient: retry with backoff
            # Refused outright (an admission policy, say): assume the most portable server.
            self.log.warning("server refused the feature probe; assuming no consumable capacity and no "
                             "device taints", error=api_error(e))
            returned = {}
        capacity, taints = slices.kept_features(probe, returned)
        self._set_features(bool(capacity), bool(taints))

    def _learn(self, sent: JSON, returned: JSON) -> None:
        """Notice a server that dropped gated fields from a real write (its gates changed since the probe)."""
        if self._counters_kept and not slices.counters_kept(sent, returned):
            self._counters_kept = False
            self.log.warning("the API server drops the partitionable-devices fields (feature gate "
                             "DRAPartitionableDevices off): no MIG devices are published (docs/mig.md)")
            self._wake.set()
        capacity, taints = slices.kept_features(sent, returned)
        if capacity is False or taints is False:
            # (after the probe: neither is None)
            self._set_features(bool(self._capacity_kept) and capacity is not False,
                               bool(self._taints_kept) and taints is not False)
            self._wake.set()  # republish in the form the server keeps

    def _set_features(self, capacity: bool, taints: bool) -> None:
        changed = (capacity, taints) != (self._capacity_kept, self._taints_kept)
        self._capacity_kept, self._taints_kept = capacity, taints
        if not changed:
            return
        self.log.info("API server features", consumable_capacity=capacity, device_taints=taints, mode=self.mode)
        if self.mode == devicemodel.CAPACITY and self.device_order == devicemodel.SPREAD:
            self.log.warning("--device-order=spread has no effect in capacity mode: each GPU is one device, and "
                             "the scheduler gives a claim the first GPU with room, so claims pack; use "
                             "--sharing-mode=partition to spread (docs/controller.md, Device order)")
        if not taints:
            self.log.info("device taints are not kept by the API server: unhealthy GPUs are left out of the slices")
        if not capacity and self.sharing_mode == devicemodel.CAPACITY:
            self.log.warning("--sharing-mode=capacity but the API server drops the consumable-capacity fields "
                             "(DRAConsumableCapacity gate off): each GPU can be allocated only once")
        if not capacity and self.sharing_mode == "auto" and not self._fallback_reported:
            self._fallback_reported = True
            self.log.warning("API server drops the consumable-capacity fields (DRAConsumableCapacity gate off); "
                             "falling back to partition mode", partitions=self.partitions)
            self._node_event("ConsumableCapacityUnavailable",
                             f"gpushare: the API server does not keep DRA consumable-capacity fields "
                             f"(feature gate DRAConsumableCapacity); publishing each GPU as {self.partitions} "
                             f"partition devices instead")

    # --- the Node -------------------------------------------------------------------------

    def _node_lookup_due(self) -> bool:
        """A missing Node is looked up again now and then: once it exists, the slices get their
        ownerReference (no request at all while the Node is known)."""
        if not self._node_checked or self._node_uid or time.monotonic() - self._node_checked_at < NODE_RETRY_S:
            return False
        self._node_checked = False
        return True

    def _look_up_node(self) -> None:
        self._node_checked_at = time.monotonic()
        try:
            node = json_body(self._core.read_node(self.node, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))
            self._node_uid = node["metadata"]["uid"]
        except client.ApiException as e:
            if e.status != 404:
                raise
            self.log.warning("Node not found; publishing slices without an ownerReference to it "
                             "(they will not be garbage-collected with the Node)")
        self._node_checked = True

    def _node_event(self, reason: str, message: str) -> None:
        """A Warning Event on the Node, where `kubectl describe node` shows it; best effort."""
        involved = {"apiVersion": "v1", "kind": "Node", "name": self.node}
        if self._node_uid:
            involved["uid"] = self._node_uid
        event = warning_event(involved, reason, message, namespace=EVENT_NAMESPACE, component=COMPONENT,
                              reporting_component=self.driver, host=self.node)
        try:
            self._core.create_namespaced_event(EVENT_NAMESPACE, plain(event), _preload_content=False,
                                               _request_timeout=REQUEST_TIMEOUT)
        except Exception as e:
            self.log.warning("could not record a Node event", reason=reason, error=_describe(e))


def _describe(e: Exception) -> str:
    if isinstance(e, client.ApiException):
        return api_error(e)
    return f"{type(e).__name__}: {e}"
