"""`gpushare-dra kubelet-plugin`: start-up, serving, shutdown.

Start-up order matters: the checkpoint is recovered (interrupted calls rolled back, specs
lost to a reboot rewritten) *before* the sockets open, so the kubelet never sees a half
state. SIGTERM: stop registering, finish in-flight calls, remove the sockets; ResourceSlices
stay in place so a restart does not make pods unschedulable.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dra_driver.agent.agent import Agent
from dra_driver.agent.metrics import AgentCollector
from dra_driver.discovery import DeviceBackend, make_backend
from dra_driver.kube import api_client as make_api_client
from dra_driver.log import get_logger

from .cdispec import SimDriver
from .driver import Driver
from .grpcapi import pluginregistration_pb2_grpc
from .metrics import Metrics
from .server import RegistrationServicer, add_dra_services

log = get_logger("kubeletplugin")

LIBRARY_NAME = "libgpushare.so"
GRPC_WORKERS = 32  # the kubelet prepares the claims of many pods in parallel calls
SHUTDOWN_GRACE_S = 10.0
LIVENESS_SERVICE = "liveness"  # the service name the DaemonSet's livenessProbe asks for


class PluginConfigError(RuntimeError):
    """A flag value the plugin cannot start with; the message names the flag."""


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
        raise PluginConfigError("--hook-dir: not set and the packaged libgpushare.so was not found "
                                "(build it with `make -C hook`, or pass --hook-dir)")
    path = os.path.join(os.path.abspath(hook_dir), LIBRARY_NAME)
    if not os.path.isfile(path):
        raise PluginConfigError(f"--hook-dir: {LIBRARY_NAME} not found in {hook_dir!r} (build it with `make -C hook`)")
    # install-hook makes libgpushare.so a symlink to a versioned file; specs name that file,
    # so every container of a claim maps the same build even across an upgrade.
    return os.path.realpath(path)


class Plugin:
    """One kubelet plugin: driver state, gRPC servers, optional slice controller and metrics."""

    def __init__(self, args: argparse.Namespace, api=None, backend: DeviceBackend | None = None):
        if not args.node_name:
            raise PluginConfigError("--node-name: required (or set NODE_NAME)")
        self.args = args
        self.plugin_dir = os.path.abspath(args.plugin_dir or f"/var/lib/kubelet/plugins/{args.driver_name}")
        self.registry_dir = os.path.abspath(args.registry_dir)
        self.dra_socket = os.path.join(self.plugin_dir, "dra.sock")
        self.reg_socket = os.path.join(self.registry_dir, f"{args.driver_name}-reg.sock")
        library = host_library(args.hook_dir or default_hook_dir())
        self.api = api or make_api_client(args.kubeconfig)
        self.backend = backend or make_backend(args.device_backend, args.mock_gpus)
        self.driver = Driver(self.api, args.driver_name, args.node_name, self.backend, args.partitions,
                             os.path.abspath(args.state_dir), os.path.abspath(args.cdi_root), library,
                             sim=self._sim_driver(library) if self.backend.name == "mock" else None)
        self.metrics = Metrics()
        self.driver.on_error = self.metrics.error
        self.agent = Agent(self.driver, self.api, interval=args.agent_interval, enforce=args.enforce,
                           sim=self.driver.sim, backstop_interval=args.backstop_interval)
        self.driver.listeners.append(self.agent)
        self.metrics.registry.register(AgentCollector(self.agent))
        self.registration = RegistrationServicer(args.driver_name, self.dra_socket)
        self.health = health.HealthServicer()
        self.slices = None
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
        state = os.path.join(os.path.abspath(self.args.state_dir), "sim.state")
        os.makedirs(os.path.dirname(state), mode=0o711, exist_ok=True)
        fd = os.open(state, os.O_CREAT | os.O_RDWR, 0o666)  # the sim initialises an empty file
        os.close(fd)
        os.chmod(state, 0o666)  # any container user opens it read-write
        # The sim gives every device one size; mock GPUs of mixed sizes get the largest.
        return SimDriver(sim_dir, state, len(gpus), max((g.memory_bytes for g in gpus), default=0))

    def start(self) -> "Plugin":
        self.driver.recover()
        self.agent.start()
        dra = grpc.server(futures.ThreadPoolExecutor(GRPC_WORKERS, thread_name_prefix="dra"))
        add_dra_services(dra, self.driver, self.metrics)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, dra)
        reg = grpc.server(futures.ThreadPoolExecutor(2, thread_name_prefix="registration"))
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, reg)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, reg)
        # The DRA socket first: the kubelet calls it as soon as registration succeeds.
        for server, path in ((dra, self.dra_socket), (reg, self.reg_socket)):
            _serve_unix(server, path)
            self._servers.append(server)
        if self.args.healthcheck_port:
            self._servers.append(self._serve_liveness(self.args.healthcheck_port))
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        if self.args.publish_slices:
            self._start_slices()
        self.metrics_port = self.metrics.serve(self.args.metrics_addr)
        log.info("kubelet plugin serving", driver=self.args.driver_name, node=self.args.node_name,
                 dra_socket=self.dra_socket, registration_socket=self.reg_socket, metrics_port=self.metrics_port)
        return self

    def _serve_liveness(self, port: int) -> grpc.Server:
        """The health service on TCP too: the kubelet's gRPC liveness probe cannot dial a unix socket."""
        server = grpc.server(futures.ThreadPoolExecutor(1, thread_name_prefix="liveness"))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        if not server.add_insecure_port(f"[::]:{port}"):
            raise PluginConfigError(f"--healthcheck-port: cannot listen on port {port}")
        server.start()
        return server

    def _start_slices(self) -> None:
        try:
            from dra_driver.controller import SliceController
        except ImportError as e:
            log.error("ResourceSlice controller unavailable; not publishing slices", error=str(e))
            return
        self.slices = SliceController(self.api, self.args.driver_name, self.args.node_name, self.backend,
                                      sharing_mode=self.args.sharing_mode, partitions=self.args.partitions).start()

    def stop(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Finish in-flight calls, remove the sockets; slices are left in place."""
        self.health.enter_graceful_shutdown()
        for server in reversed(self._servers):  # registration first: the kubelet stops calling
            server.stop(grace).wait()
        self._servers.clear()
        for path in (self.reg_socket, self.dra_socket):
            _unlink(path)
        if self.slices is not None:
            self.slices.stop()
        self.agent.stop()
        self.metrics.stop()
        log.info("kubelet plugin stopped", driver=self.args.driver_name)


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
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        plugin = Plugin(args).start()
    except PluginConfigError as e:
        log.error("cannot start", error=str(e))
        return 2
    stop.wait()
    log.info("signal received, shutting down")
    plugin.stop()
    return 0
