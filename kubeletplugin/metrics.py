"""The plugin's one Prometheus registry, served on --metrics-addr (empty disables): Prepare and
Unprepare counts, latencies and errors by reason here; the node agent's per-claim and per-GPU
metrics join it as a collector (dra_driver/agent/metrics.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from dra_driver.flags import split_host_port


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()  # per plugin, so tests can run several in one process
        self.calls = Counter("gpushare_kubelet_plugin_claims_total", "Claims handled, by operation and result",
                             ["operation", "result"], registry=self.registry)
        self.latency = Histogram("gpushare_kubelet_plugin_claim_seconds", "Time to handle one claim, by operation",
                                 ["operation"], registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
        self.errors = Counter("gpushare_kubelet_plugin_errors_total", "Claims that failed, by operation and reason",
                              ["operation", "reason"], registry=self.registry)
        self._server = None

    def error(self, operation: str, reason: str) -> None:
        self.errors.labels(operation, reason).inc()

    def observe(self, operation: str, seconds: float, ok: bool) -> None:
        self.calls.labels(operation, "success" if ok else "error").inc()
        self.latency.labels(operation).observe(seconds)

    def serve(self, addr: str) -> int | None:
        """Serve /metrics on HOST:PORT (":9400" = all addresses); return the bound port."""
        if not addr:
            return None
        host, port = split_host_port(addr)
        self._server, _thread = start_http_server(port, addr=host or "0.0.0.0", registry=self.registry)
        return self._server.server_port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
