"""`gpushare-dra kubelet-plugin`: start-up, serving, shutdown.

Start-up order matters: the checkpoint is recovered (interrupted calls rolled back, specs
lost to a reboot rewritten) *before* the sockets open, so the kubelet never sees a half
state. SIGTERM: hand over to the node's next plugin pod (serve until the kubelet registered it,
at most --handover-timeout), stop registering, finish in-flight calls, remove the sockets; ResourceSlices
stay in place so a restart does not make pods unschedulable.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent import futures
from typing import TYPE_CHECKING

import grpc
import pynvml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from kubernetes import client

from dra_driver.config.strategies import GpuStrategies
from dra_driver.controller.slices import desired_devices, mig_note
from dra_driver.devicemodel import CAPACITY, PARTITION
from dra_driver.discovery import DeviceBackend, MockBackend, make_backend
from dra_driver.flags import FlagError, check_port_free, split_host_port
from dra_driver.install import LIBRARY_NAME
from dra_driver.kube import api_client as make_api_client
from dra_driver.log import get_logger
from dra_driver.mig import GpuSet, MigInstances
from dra_driver.runloop import serve
from kubeletplugin.agent.agent import Agent
from kubeletplugin.agent.metrics import AgentCollector
from kubeletplugin.agent.sampler import load_simulated_nvml
from kubeletplugin.health import HealthAwareBackend, HealthCollector, HealthMonitor

from .cdispec import SimDriver
from .config import PluginConfig
from .driver import Driver
from .faults import NO_FAULTS, Faults
from .grpcapi import dra_health_v1alpha1_pb2_grpc, pluginregistration_pb2_grpc
from .healthservice import DeviceHealthServicer
from .instances import NodeLeader, Registrations
from .metrics import Metrics
from .nodestate import NodeState
from .server import RegistrationServicer, add_dra_services
from .strategies.mps.control import MpsControl, control_program

if TYPE_CHECKING:
    from dra_driver.controller import SliceController

log = get_logger("kubeletplugin")

GRPC_WORKERS = 32  # the kubelet prepares the claims of many pods in parallel calls
SHUTDOWN_GRACE_S = 10.0
LIVENESS_SERVICE = "liveness"  # the service name the DaemonSet's livenessProbe asks for


class PluginConfigError(FlagError):
    """A flag value the plugin cannot start with; the CLI prints it as one line, exit 2."""


def default_hook_dir() -> str | None:
    try:
        from dra_driver.hookpath import native_paths
    except ImportError:
        return None
    try:
        return os.path.dirname(native_paths()["library"])
    except Exception:  # not built: reported below as a missing --hook-dir library
        return None


def host_library(hook_dir: str | None) -> str:
    if not hook_dir:
        raise PluginConfigError("--hook-dir", "not set and the packaged libgpushare.so was not found "
                                "(build it with `make -C hook`, or pass --hook-dir)")
    path = os.path.join(os.path.abspath(hook_dir), LIBRARY_NAME)
    if not os.path.isfile(path):
        raise PluginConfigError("--hook-dir",
                                f"{LIBRARY_NAME} not found in {hook_dir!r} (build it with `make -C hook`)")
    # install-hook makes libgpushare.so a symlink to a versioned file; specs name that file,
    # so every container of a claim maps the same build even across an upgrade.
    return os.path.realpath(path)


def check_writable_dir(flag: str, path: str) -> None:
    """PluginConfigError naming `flag` unless `path` is a folder this process can write or can be
    made (its nearest existing ancestor is a writable folder). Checks only: nothing is made here,
    so a bad flag leaves nothing behind."""
    nearest = os.path.abspath(path)
    while not os.path.lexists(nearest) and os.path.dirname(nearest) != nearest:
        nearest = os.path.dirname(nearest)
    what = "write" if nearest == os.path.abspath(path) else "create"
    if not os.path.isdir(nearest):
        raise PluginConfigError(flag, f"cannot {what} {path!r}: {nearest!r} is not a folder")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise PluginConfigError(flag, f"cannot {what} {path!r}: {nearest!r} is not writable by this process")


class Plugin:
    """One kubelet plugin: driver state, gRPC servers, optional slice controller and metrics."""

    def __init__(self, config: PluginConfig, api: client.ApiClient | None = None,
                 backend: DeviceBackend | None = None, faults: Faults = NO_FAULTS) -> None:
        if not config.node_name:
            raise PluginConfigError("--node-name", "required (or set NODE_NAME)")
        # Ports first, before any file or socket exists: a taken port is one line, nothing left behind.
        if config.metrics_addr:
            host, port = split_host_port(config.metrics_addr)
            check_port_free("--metrics-addr", host or "0.0.0.0", port)
        check_port_free("--healthcheck-port", "", config.healthcheck_port, zero="0 to disable")
        self.config = config
        self.plugin_dir = os.path.abspath(config.plugin_dir or f"/var/lib/kubelet/plugins/{config.driver_name}")
        self.registry_dir = os.path.abspath(config.registry_dir)
        # With a pod UID, each pod's sockets have their own names, so the kubelet (1.33+) keeps
        # the old and the new pod of a rolling upgrade registered at once (names as upstream's
        # kubeletplugin helper gives them, k8s.io/dynamic-resource-allocation RollingUpdate).
        uid_part = f"-{config.pod_uid}" if config.pod_uid else ""
        self.dra_socket = os.path.join(self.plugin_dir, f"dra{uid_part}.sock")
        self.reg_socket = os.path.join(self.registry_dir, f"{config.driver_name}{uid_part}-reg.sock")
        library = host_library(config.hook_dir or default_hook_dir())
        # The folders the plugin writes (made when missing): one line naming the flag if it cannot.
        for flag, path in (("--state-dir", config.state_dir), ("--cdi-root", config.cdi_root),
                           ("--plugin-dir", self.plugin_dir), ("--registry-dir", self.registry_dir)):
            check_writable_dir(flag, path)
        self.api = api or make_api_client(config.kubeconfig)
        self.gpu_health = HealthMonitor(config.health_recovery_seconds, ignored_xids=config.health_ignore_xids)
        backend = backend or make_backend(config.device_backend, config.mock_gpus, config.driver_root)
        self.backend = HealthAwareBackend(backend, self.gpu_health)
        # Every flag is good: make the folders (a write the access check could not foresee, such as
        # in /proc or a read-only mount, is still one line).
        for flag, path, mode in (("--state-dir", config.state_dir, 0o711), ("--cdi-root", config.cdi_root, 0o755)):
            try:
                os.makedirs(path, mode=mode, exist_ok=True)
            except OSError as e:
                raise PluginConfigError(flag, f"cannot create {path!r}: {e.strerror}") from None
        # NVIDIA's daemon from the driver root when it has one and --mps-control was left alone
        mps_control, mps_root = control_program(config.mps_control, config.driver_root)
        try:
            self.strategies = GpuStrategies.parse(config.mps_gpus, config.mixed_strategies)
        except ValueError as e:
            raise PluginConfigError("--mps-gpus", str(e)) from None
        try:
            self.mig_gpus = GpuSet.parse(config.mig_gpus)
        except ValueError as e:
            raise PluginConfigError("--mig-gpus", str(e)) from None
        state_dir = os.path.abspath(config.state_dir)
        sim = self._sim_driver(library) if self.backend.name == "mock" else None
        self.mig = self._mig_control(backend, sim)
        self.driver = Driver(self.api, config.driver_name, config.node_name, self.backend, config.partitions, library,
                             NodeState.open(state_dir, config.cdi_root),
                             MpsControl(state_dir, mps_control, root=mps_root),  # mps_root: run it chrooted there
                             gpu_strategies=self.strategies,
                             sim=sim, faults=faults, mig=self.mig)
        self.metrics = Metrics()
        self.metrics.instrument(self.api)
        self.driver.on_error = self.metrics.error
        self.agent = Agent(self.driver, self.driver.files, self.api, config.driver_name, config.node_name,
                           self.backend.name, interval=config.agent_interval, enforce=config.enforce,
                           sim=self.driver.sim, backstop_interval=config.backstop_interval,
                           state_dir=os.path.abspath(config.state_dir))
        self.driver.listeners.append(self.agent)
        self.metrics.registry.register(AgentCollector(self.agent))
        self.metrics.registry.register(HealthCollector(self.gpu_health))
        # With a pod UID, a newer pod's plugin may take over: a stopping one waits for it (stop()).
        self.registrations = Registrations(os.path.abspath(config.state_dir), config.pod_uid) \
            if config.pod_uid else None
        self.registration = RegistrationServicer(config.driver_name, self.dra_socket,
                                                 self.registrations.mark if self.registrations else lambda: None)
        self.health = health.HealthServicer()
        self.device_health = DeviceHealthServicer(config.node_name, self._device_health)
        self.gpu_health.listeners += [self.device_health.notify, self._rediscover]
        self.slices: SliceController | None = None
        self.leader: NodeLeader | None = None
        self._servers: list[grpc.Server] = []
        self.metrics_port: int | None = None

    def _sim_driver(self, library: str) -> SimDriver | None:
        """Mock GPUs: containers get the simulated driver, so CUDA programs in them run."""
        sim_dir = SimDriver.find(os.path.dirname(library))
        if sim_dir is None:
            log.warning("mock backend without the simulated driver beside the library; containers get no "
                        "libcuda.so.1 (install it with `gpushare-dra install-hook --with-sim`)",
                        looked_in=os.path.join(os.path.dirname(library), "sim"))
            return None
        gpus = self.backend.discover()
        state = os.path.join(os.path.abspath(self.config.state_dir), "sim.state")
        os.makedirs(os.path.dirname(state), mode=0o711, exist_ok=True)
        fd = os.open(state, os.O_CREAT | os.O_RDWR, 0o666)  # the sim initialises an empty file
        os.close(fd)
        os.chmod(state, 0o666)  # any container user opens it read-write
        # The sim gives every device one size; mock GPUs of mixed sizes get the largest.
        return SimDriver(sim_dir, state, len(gpus), max((g.memory_bytes for g in gpus), default=0),
                         ",".join(str(g.index) for g in gpus if g.mig_mode))

    def _mig_control(self, backend: DeviceBackend, sim: SimDriver | None) -> MigInstances | None:
        """NVML for MIG instances when --mig-gpus names any GPU: the node's, or on mock nodes the
        simulated one every container of the node maps. Says once per GPU why it offers no MIG devices."""
        if not self.mig_gpus:
            return None
        if isinstance(backend, MockBackend):
            if sim is None:
                log.warning("--mig-gpus on mock GPUs without the simulated NVML: no MIG devices")
                return None
            load_simulated_nvml(sim.host_dir, sim.env(sim.state_path))
            pynvml.nvmlInit()
            backend.mig_nvml = pynvml
        for gpu in self.backend.discover():
            if note := mig_note(gpu, self.mig_gpus):
                (log.info if gpu.mig_mode and gpu.mig_profiles else log.warning)(note, gpu=gpu.index)
        return MigInstances(pynvml)

    def start(self) -> Plugin:
        self.driver.recover()
        self.agent.start_status()
        dra = grpc.server(futures.ThreadPoolExecutor(GRPC_WORKERS, thread_name_prefix="dra"))
        add_dra_services(dra, self.driver, self.metrics)
        dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(self.device_health, dra)  # type: ignore[no-untyped-call]  # generated
        health_pb2_grpc.add_HealthServicer_to_server(self.health, dra)
        reg = grpc.server(futures.ThreadPoolExecutor(2, thread_name_prefix="registration"))
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, reg)  # type: ignore[no-untyped-call]  # generated
        health_pb2_grpc.add_HealthServicer_to_server(self.health, reg)
        try:
            # The DRA socket first: the kubelet calls it as soon as registration succeeds.
            for server, path in ((dra, self.dra_socket), (reg, self.reg_socket)):
                _serve_unix(server, path)
                self._servers.append(server)
            if self.config.healthcheck_port:
                self._servers.append(self._serve_liveness(self.config.healthcheck_port))
            self.health.set("", health_pb2.HealthCheckResponse.SERVING)
            self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
            self.leader = NodeLeader(os.path.abspath(self.config.state_dir))
            if self.leader.try_take():
                self._start_node_work()
            else:
                log.info("another plugin instance on this node runs the node agent and publishes slices "
                         "(a rolling upgrade); this one serves calls and takes over when it stops",
                         lock=self.leader.path)
                self.leader.take_later(self._start_node_work)
            try:
                self.metrics_port = self.metrics.serve(self.config.metrics_addr)
            except OSError as e:  # taken since the check
                raise PluginConfigError("--metrics-addr", f"cannot listen on {self.config.metrics_addr}: "
                                                          f"{e.strerror}") from None
        except BaseException:
            self.stop(grace=0)  # a port taken since the check: no sockets left behind
            raise
        log.info("kubelet plugin serving", driver=self.config.driver_name, node=self.config.node_name,
                 dra_socket=self.dra_socket, registration_socket=self.reg_socket, metrics_port=self.metrics_port)
        return self

    def _hand_over(self) -> None:
        """A pod deleted or evicted gets SIGTERM while the DaemonSet starts its successor: serve
        on until the kubelet has registered the successor (at most --handover-timeout), so a pod
        created meanwhile finds a plugin. Without one, the kubelet fails the pod's prepare with
        "not registered" and retries only at its next resync, 60 to 90 s later."""
        if self.registrations is None or self.config.handover_timeout <= 0:
            return
        start = time.monotonic()
        successor = self.registrations.wait_for_successor(self.config.handover_timeout)
        waited = round(time.monotonic() - start, 1)
        if successor:
            log.info("the kubelet registered this node's next plugin; stopping", successor=successor,
                     waited_s=waited)
        elif self.registrations.registered:
            log.info("no other plugin registered on this node; stopping", waited_s=waited)

    def _start_node_work(self) -> None:
        """What one instance per node does: the node agent, GPU health events, the slices."""
        self.agent.start()  # first: on mock nodes it loads the simulated NVML the health monitor uses
        if self.config.health_events:
            if self.backend.name == "nvml" or self.driver.sim is not None:
                self.gpu_health.start()
            else:
                log.warning("mock backend without the simulated NVML: no GPU health events")
        if self.config.publish_slices:
            self._start_slices()

    def _serve_liveness(self, port: int) -> grpc.Server:
        """The health service on TCP too: the kubelet's gRPC liveness probe cannot dial a unix socket."""
        # No SO_REUSEPORT (gRPC's default): a second plugin on the same port must fail, not share it.
        server = grpc.server(futures.ThreadPoolExecutor(1, thread_name_prefix="liveness"),
                             options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            bound = server.add_insecure_port(f"[::]:{port}")
        except RuntimeError:  # newer grpcio raises instead of returning 0
            bound = 0
        if not bound:
            raise PluginConfigError("--healthcheck-port", f"cannot listen on port {port} (accepted: a free port, "
                                    "or 0 to disable)")
        server.start()
        return server

    def _start_slices(self) -> None:
        try:
            from dra_driver.controller import SliceController
        except ImportError as e:
            log.error("ResourceSlice controller unavailable; not publishing slices", error=str(e))
            return
        self.slices = SliceController(self.api, self.config.driver_name, self.config.node_name, self.backend,
                                      sharing_mode=self.config.sharing_mode, partitions=self.config.partitions,
                                      taint_effect=self.config.unhealthy_taint_effect,
                                      device_order=self.config.device_order, strategies=self.strategies,
                                      mig_gpus=self.mig_gpus).start()

    def _rediscover(self) -> None:
        if self.slices is not None:
            self.slices.rediscover_now()

    def _device_health(self) -> list[tuple[str, bool, str]]:
        """(device name, healthy, why not) of every device this node publishes, for the kubelet."""
        mode = self.slices.mode if self.slices is not None else self.config.sharing_mode
        if mode not in (CAPACITY, PARTITION):  # "auto" before the server was asked: names unknown yet
            return []
        return [(d["name"], gpu.healthy, gpu.health_reason) for gpu in self.backend.discover()
                for d in desired_devices([gpu], mode, self.config.partitions, taints=True, mig_gpus=self.mig_gpus)]

    def stop(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Hand over to a successor, finish in-flight calls, remove the sockets; slices are left in place."""
        if grace > 0:
            self._hand_over()
        self.health.enter_graceful_shutdown()
        self.device_health.close()  # its streams would hold up the servers' grace period
        # The registration socket goes first: the kubelet's plugin watcher sees it go and stops
        # calling this instance (another one, in a rolling upgrade, takes the calls).
        _unlink(self.reg_socket)
        if self.registrations is not None:
            self.registrations.clear()
        for server in reversed(self._servers):
            server.stop(grace).wait()
        self._servers.clear()
        _unlink(self.dra_socket)
        if self.leader is not None:
            self.leader.stop_waiting()  # no take-over from now on
        if self.slices is not None:
            self.slices.stop()
        self.agent.stop()
        self.gpu_health.stop()
        if self.leader is not None:
            self.leader.release()  # after the agent stopped: the other instance's agent starts now
            self.leader = None
        self.driver.close()
        self.metrics.stop()
        log.info("kubelet plugin stopped", driver=self.config.driver_name)


def _serve_unix(server: grpc.Server, path: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
    _unlink(path)  # a socket left by a crashed run
    old = os.umask(0o177)  # the socket is created 0600: only root may talk to the plugin
    try:
        server.add_insecure_port(f"unix://{path}")
        server.start()
    finally:
        os.umask(old)
    os.chmod(path, 0o600)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def run(args: argparse.Namespace) -> int:
    # a bad flag raises PluginConfigError from start(): the CLI's one-line error
    config = PluginConfig.from_args(args)
    faults = Faults.from_env()  # the crash tests' (kubeletplugin/faults.py); none in production
    return serve(lambda: Plugin(config, faults=faults).start(), log, "signal received, shutting down")
