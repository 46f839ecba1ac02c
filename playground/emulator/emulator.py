"""ApiEmulator: an in-process Kubernetes API server for tests, the demo and benchmarks."""

import threading

import kubernetes.client
import yaml

from playground.emulator import features

from .faults import Faults
from .registry import Registry
from .requestlog import RequestLog
from .server import EmulatorHTTPServer
from .store import Store
from .validation import Validator


class ApiEmulator:
    def __init__(self, consumable_capacity=None, device_taints=None, validate=True,
                 kube_version=None, history=1000, bookmark_interval=1.0,
                 host="127.0.0.1", port=0):
        """kube_version: the release served (default: the newest with schemas); its feature
        gates are on or off as that release's defaults (features.default_gates), except
        consumable_capacity and device_taints when given (a cluster that sets those gates)."""
        self.store = Store(history=history)
        self.validator = Validator(kube_version, enabled=validate)
        self.gates = features.default_gates(self.validator.kube_version)
        for gate, enabled in ((features.CONSUMABLE_CAPACITY, consumable_capacity),
                              (features.DEVICE_TAINTS, device_taints)):
            if enabled is not None:
                self.gates[gate] = enabled
        self.registry = Registry(self.store, self.validator, self.gates)
        self.faults = Faults(drop_watches_callback=self.store.close_watches)
        self.requests_log = RequestLog()
        self.bookmark_interval = bookmark_interval
        self.stopping = False
        # (namespace, pod, container) -> the container's output, or None before it started:
        # what the kubelet serves for `kubectl logs`; set by a node that runs pods (the playground).
        self.pod_logs = None
        self._address = (host, port)
        self._server: EmulatorHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------

    def start(self):
        self._server = EmulatorHTTPServer(self._address, self)
        # A short poll interval keeps stop() fast; tests start and stop many emulators.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="api-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._server is None:
            return
        self.stopping = True
        self.store.close_watches()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    # --- clients ------------------------------------------------------------------------

    @property
    def url(self):
        assert self._server is not None, "the emulator is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"  # type: ignore[str-bytes-safe]  # an IP address: str

    def client_configuration(self):
        configuration = kubernetes.client.Configuration()
        configuration.host = self.url
        return configuration

    def api_client(self):
        return kubernetes.client.ApiClient(self.client_configuration())

    def write_kubeconfig(self, path):
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {}}],
            "contexts": [{"name": "emulator",
                          "context": {"cluster": "emulator", "user": "emulator"}}],
        }
        with open(path, "w") as f:
            yaml.safe_dump(kubeconfig, f)
        return path

    # --- observability ------------------------------------------------------------------

    @property
    def requests(self):
        return self.requests_log.records()

    def reset_requests(self):
        self.requests_log.reset()

    def wait_quiet(self, quiet_s=0.5, timeout=10.0):
        return self.requests_log.wait_quiet(quiet_s, timeout)

    def count_requests(self, method=None, path_contains=None, writes_only=False):
        return self.requests_log.count(method, path_contains, writes_only)
