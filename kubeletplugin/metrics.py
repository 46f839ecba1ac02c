"""The plugin's one Prometheus registry, served on --metrics-addr (empty disables).

Here: Prepare and Unprepare counts, latencies and errors by reason; requests to the API
server by verb and code, and their latency; `gpushare_build_info`; the process collector
(CPU, memory, open files). The node agent's per-claim and per-GPU metrics join it as a
collector (kubeletplugin/agent/metrics.py). Only `/metrics` answers with metrics.

Anyone who reaches the port can connect, so what a client holds is bounded (MetricsServer): an
open connection costs no thread (one asyncio loop waits on them all), at most MAX_CONNECTIONS are
open, each is closed REQUEST_TIMEOUT_S after it opened whether or not it sent anything, and
SCRAPE_WORKERS threads build the answers.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import platform
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from typing import Any
from wsgiref.handlers import SimpleHandler
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
MAX_CONNECTIONS = 64     # open at once; one more closes the oldest that has not sent its request yet
REQUEST_TIMEOUT_S = 10   # a connection's whole exchange, request in and answer out (Prometheus' scrape_timeout)
HEAD_MAX = 8192          # bytes of a request's line and headers (a scrape sends a few hundred)
SCRAPE_WORKERS = 2       # threads that build answers (the collectors read the regions and NVML)


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
        self._server: MetricsServer | None = None

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
        self._server = MetricsServer(_only_metrics(make_wsgi_app(self.registry)), host or "0.0.0.0", port)
        return self._server.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def _only_metrics(app: WSGIApplication) -> WSGIApplication:
    """Metrics at /metrics and nowhere else: a probe or a crawler on `/` gets a 404, not a scrape."""
    def only(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == METRICS_PATH:
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [f"not found; metrics are at {METRICS_PATH}\n".encode()]
    return only


class MetricsServer:
    """Serves a WSGI app over HTTP/1.0, one request per connection, with bounded resources: the
    stdlib's threading server held a thread per connection with no timeout (1,000 idle
    connections: 1,014 threads, +27 MiB, for as long as the client liked). Connections wait on
    one asyncio loop; each exchange has one deadline (a request trickled a byte at a time is cut
    there, where a timeout per read never trips); answers are built on SCRAPE_WORKERS threads."""

    def __init__(self, app: WSGIApplication, host: str, port: int) -> None:
        self.app = app
        self._loop = asyncio.new_event_loop()
        self._scrapes = ThreadPoolExecutor(SCRAPE_WORKERS, thread_name_prefix="metrics-scrape")
        self._open: dict[asyncio.StreamWriter, bool] = {}  # connection -> still sending its request (oldest first)
        self._tasks: set[asyncio.Task[None]] = set()
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._connection, host, port, limit=HEAD_MAX))
        except BaseException:
            self._loop.close()
            self._scrapes.shutdown()
            raise
        self.port: int = self._server.sockets[0].getsockname()[1]
        self._thread = threading.Thread(target=self._loop.run_forever, name="metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        async def close() -> None:
            self._server.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._scrapes.shutdown(wait=False, cancel_futures=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= MAX_CONNECTIONS:
            waiting = next((w for w, sending in self._open.items() if sending), None)
            if waiting is None:  # every open one is being answered: this one tries again later
                writer.transport.abort()
                return
            del self._open[waiting]  # its task ends on the reset
            waiting.transport.abort()
        task = asyncio.current_task()
        assert task is not None  # a connection's callback runs as a task
        self._tasks.add(task)
        self._open[writer] = True
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    answer = _plain_answer("431 Request Header Fields Too Large", f"request head over {HEAD_MAX} bytes")
                else:
                    self._open[writer] = False
                    answer = await self._loop.run_in_executor(self._scrapes, self._answer, head)
                writer.write(answer)
                writer.close()
                await writer.wait_closed()
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass  # too slow, or gone: nothing to answer
        finally:
            self._open.pop(writer, None)
            self._tasks.discard(task)
            writer.transport.abort()  # a no-op once closed; else drops what a slow reader left unread

    def _answer(self, head: bytes) -> bytes:
        """The whole HTTP answer to one request head (its line, headers and the blank line)."""
        line, _, rest = head.partition(b"\r\n")
        try:
            method, target, version = line.decode("latin-1").split()
            headers = http.client.parse_headers(io.BytesIO(rest))
        except (ValueError, http.client.HTTPException):
            return _plain_answer("400 Bad Request", f"not an HTTP request: {line[:80]!r}")
        path, _, query = target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method, "PATH_INFO": urllib.parse.unquote(path), "QUERY_STRING": query,
            "SERVER_PROTOCOL": version, "SERVER_NAME": "gpushare-metrics", "SERVER_PORT": str(self.port),
            **{"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()}}
        out = io.BytesIO()
        SimpleHandler(io.BytesIO(), out, sys.stderr, environ, multithread=True, multiprocess=False).run(self.app)
        return out.getvalue()


def _plain_answer(status: str, text: str) -> bytes:
    body = f"{text}\n".encode()
    return (f"HTTP/1.0 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n\r\n"
            .encode() + body)
