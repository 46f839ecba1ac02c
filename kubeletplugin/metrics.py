"""The plugin's one Prometheus registry, served on --metrics-addr (empty disables).

Here: Prepare and Unprepare counts, latencies and errors by reason; requests to the API
server by verb and code, and their latency; `gpushare_build_info`; the process collector
(CPU, memory, open files). The node agent's per-claim and per-GPU metrics join it as a
collector (kubeletplugin/agent/metrics.py). Only `/metrics` answers with metrics.
"""

from __future__ import annotations

import platform
import socket
import threading
import time
from collections.abc import Iterable
from importlib import metadata
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    make_wsgi_app,
)

from dra_driver.flags import split_host_port

METRICS_PATH = "/metrics"


def version() -> str:
    try:
        return metadata.version("gpushare-dra")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class Metrics:
    def __init__(self) -> None:
        # no `<counter>_created` series: Prometheus stores each as a series of its own, and no
        # query here needs a counter's creation time (process-wide setting of the client)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()  # per plugin, so tests can run several in one process
        ProcessCollector(registry=self.registry)
        Gauge("gpushare_build_info", "Always 1; the labels say which build runs",
              ["version", "python_version"], registry=self.registry).labels(version(), platform.python_version()).set(1)
        self.calls = Counter("gpushare_kubelet_plugin_claims_total", "Claims handled, by operation and result",
                             ["operation", "result"], registry=self.registry)
        self.latency = Histogram("gpushare_kubelet_plugin_claim_seconds", "Time to handle one claim, by operation",
                                 ["operation"], registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
        self.errors = Counter("gpushare_kubelet_plugin_errors_total", "Claims that failed, by operation and reason",
                              ["operation", "reason"], registry=self.registry)
        self.api_requests = Counter("gpushare_api_requests_total",
                                    "Requests to the Kubernetes API server, by HTTP verb and status code "
                                    "(code \"error\": no answer)", ["verb", "code"], registry=self.registry)
        self.api_latency = Histogram("gpushare_api_request_duration_seconds",
                                     "Time until the API server's answer (a watch: until its headers), by verb",
                                     ["verb"], registry=self.registry,
                                     buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self._server: WSGIServer | None = None

    def error(self, operation: str, reason: str) -> None:
        self.errors.labels(operation, reason).inc()

    def observe(self, operation: str, seconds: float, ok: bool) -> None:
        self.calls.labels(operation, "success" if ok else "error").inc()
        self.latency.labels(operation).observe(seconds)

    def instrument(self, api_client: object) -> None:
        """Count every request a kubernetes.client.ApiClient sends (all API classes share its rest client).
        A client shared by several plugins (tests) counts into the newest one's registry."""
        rest = getattr(api_client, "rest_client", None)
        if rest is None:  # not a kubernetes client
            return
        first = not hasattr(rest, "_gpushare_metrics")
        rest._gpushare_metrics = self
        if not first:
            return
        send = rest.request

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            code = "error"
            try:
                resp = send(method, url, *args, **kwargs)
                code = str(resp.status)
                return resp
            except Exception as e:
                status = getattr(e, "status", None)  # ApiException carries the server's code
                if status:
                    code = str(status)
                raise
            finally:
                metrics = rest._gpushare_metrics
                metrics.api_requests.labels(method, code).inc()
                metrics.api_latency.labels(method).observe(time.monotonic() - started)

        rest.request = request

    def serve(self, addr: str) -> int | None:
        """Serve /metrics on HOST:PORT (":9400" = all addresses); return the bound port."""
        if not addr:
            return None
        host, port = split_host_port(addr)
        host = host or "0.0.0.0"
        server_class = type("Server", (_ThreadingServer,),
                            {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
        self._server = make_server(host, port, _only_metrics(make_wsgi_app(self.registry)), server_class,
                                   handler_class=_QuietHandler)
        threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True).start()
        return self._server.server_port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _only_metrics(app: WSGIApplication) -> WSGIApplication:
    """Metrics at /metrics and nowhere else: a probe or a crawler on `/` gets a 404, not a scrape."""
    def only(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == METRICS_PATH:
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [f"not found; metrics are at {METRICS_PATH}\n".encode()]
    return only


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds up shutdown


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # one access line per scrape is noise
        pass
