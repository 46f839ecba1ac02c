"""The kubelet's side of the plugin's sockets: a stand-in for tests, benchmarks, the demo and the playground.

It speaks to the plugin exactly as the kubelet does: registration over
`<registry-dir>/<driver>-reg.sock`, DRA v1 or v1beta1 over `<plugin-dir>/dra.sock`, with
the generated stubs. Claims are named by ClaimRef (namespace, name, uid), as the kubelet sends them.
`Kubelet` talks to one plugin instance; `PluginManager` watches the registry folder and picks
among several instances of the driver as the kubelet does (a rolling upgrade).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import grpc

from kubeletplugin.claimref import ClaimRef
from kubeletplugin.grpcapi import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

_PB = {"v1": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}


def _claims(pb: Any, claims: tuple[ClaimRef, ...]) -> list[Any]:
    return [pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]


class Kubelet:
    def __init__(self, dra_socket: str, reg_socket: str):
        self.dra = grpc.insecure_channel(f"unix://{dra_socket}")
        self.reg = grpc.insecure_channel(f"unix://{reg_socket}")

    def close(self) -> None:
        self.dra.close()
        self.reg.close()

    def get_info(self):
        return pluginregistration_pb2_grpc.RegistrationStub(self.reg).GetInfo(
            pluginregistration_pb2.InfoRequest(), timeout=5)

    def notify(self, registered: bool, error: str = "") -> None:
        pluginregistration_pb2_grpc.RegistrationStub(self.reg).NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=registered, error=error), timeout=5)

    def prepare(self, *claims: ClaimRef, version: str = "v1", timeout: float = 30) -> Any:
        pb, pb_grpc = _PB[version]
        request = pb.NodePrepareResourcesRequest(claims=_claims(pb, claims))
        return pb_grpc.DRAPluginStub(self.dra).NodePrepareResources(request, timeout=timeout)

    def unprepare(self, *claims: ClaimRef, version: str = "v1", timeout: float = 30) -> Any:
        pb, pb_grpc = _PB[version]
        request = pb.NodeUnprepareResourcesRequest(claims=_claims(pb, claims))
        return pb_grpc.DRAPluginStub(self.dra).NodeUnprepareResources(request, timeout=timeout)


class PluginManager:
    """The kubelet's plugin watcher and DRA plugin manager, for a rolling upgrade's two instances.

    What the kubelet (1.33+) does, from pkg/kubelet/pluginmanager (watcher, reconciler) and
    pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go: a socket appearing in the registry
    folder is asked GetInfo, its endpoint registered under the driver name (an endpoint
    already registered is refused) and told NotifyRegistrationStatus; every registered
    instance is kept, in registration order; a call goes to the newest instance whose gRPC
    connection is up, else to the newest; a registration socket that goes away deregisters its
    instance. The kubelet learns of sockets through fsnotify and reconciles every second; this
    stand-in polls every `poll_s`.
    """

    def __init__(self, registry_dir: str, driver_name: str, poll_s: float = 0.05) -> None:
        self.registry_dir = registry_dir
        self.driver_name = driver_name
        self.poll_s = poll_s
        self._plugins: list[_Registered] = []  # registration order, newest last
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plugin-watcher", daemon=True)
        self.calls_by_endpoint: dict[str, int] = {}  # for tests: which instance served how many calls

    def start(self) -> PluginManager:
        self.sync()
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for p in self._plugins:
                p.close()
            self._plugins.clear()

    def endpoints(self) -> list[str]:
        with self._lock:
            return [p.endpoint for p in self._plugins]

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.sync()

    def sync(self) -> None:
        """Register new registration sockets, deregister removed ones."""
        try:
            present = {os.path.join(self.registry_dir, n) for n in os.listdir(self.registry_dir)
                       if n.endswith(".sock")}
        except FileNotFoundError:
            present = set()
        with self._lock:
            gone = [p for p in self._plugins if p.socket not in present]
            self._plugins = [p for p in self._plugins if p.socket in present]
            known = {p.socket for p in self._plugins}
        for plugin in gone:
            plugin.close()
        for socket in sorted(present - known):
            self._register(socket)

    def _register(self, socket: str) -> None:
        reg = grpc.insecure_channel(f"unix://{socket}")
        try:
            stub = pluginregistration_pb2_grpc.RegistrationStub(reg)
            info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)
            if info.name != self.driver_name or info.type != "DRAPlugin":
                return  # another plugin's socket: not ours to handle
            with self._lock:
                taken = any(p.endpoint == info.endpoint for p in self._plugins)
            error = f"endpoint {info.endpoint} already registered for DRA driver plugin {info.name}" if taken else ""
            stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=not taken, error=error), timeout=5)
            if taken:
                return
        except grpc.RpcError:
            return  # not serving (yet, or any more): the next sync tries again
        finally:
            reg.close()
        plugin = _Registered(socket, info.endpoint)
        with self._lock:
            self._plugins.append(plugin)

    def _pick(self) -> _Registered:
        with self._lock:
            if not self._plugins:
                raise LookupError(f"DRA driver {self.driver_name} is not registered")
            connected = [p for p in self._plugins if p.connected]
            return (connected or self._plugins)[-1]

    def prepare(self, *claims: ClaimRef, timeout: float = 30) -> Any:
        plugin = self._pick()
        self._count(plugin)
        return plugin.kubelet.prepare(*claims, timeout=timeout)

    def unprepare(self, *claims: ClaimRef, timeout: float = 30) -> Any:
        plugin = self._pick()
        self._count(plugin)
        return plugin.kubelet.unprepare(*claims, timeout=timeout)

    def _count(self, plugin: _Registered) -> None:
        with self._lock:
            self.calls_by_endpoint[plugin.endpoint] = self.calls_by_endpoint.get(plugin.endpoint, 0) + 1


class _Registered:
    """One registered instance: its DRA connection, and whether that connection is up."""

    def __init__(self, socket: str, endpoint: str) -> None:
        self.socket = socket
        self.endpoint = endpoint
        self.kubelet = Kubelet(endpoint, socket)
        self.connected = False
        # as the kubelet: connect now, not at the first call, and follow the connection's state
        self.kubelet.dra.subscribe(self._on_state, try_to_connect=True)

    def _on_state(self, state: grpc.ChannelConnectivity) -> None:
        self.connected = state == grpc.ChannelConnectivity.READY

    def close(self) -> None:
        self.kubelet.dra.unsubscribe(self._on_state)
        self.kubelet.close()
