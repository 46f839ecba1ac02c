"""Kubernetes API access shared by every role: one way to build a client, read a raw response,
name a failure and build an Event, and one deadline for a call's whole exchange."""

from __future__ import annotations

import datetime
import functools
import json
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import urllib3
import yaml
from kubernetes import client, config

from .flags import StartupError

JSON = dict[str, Any]  # an object as the API server's JSON, not the client's model
# A background thread's API call gives up after this long: a hung API server must not hold the
# node agent's threads, or the plugin's shutdown (which joins them), for ever.
BACKGROUND_API_TIMEOUT_S = 10
API_BODY_MAX = 4 << 20  # bytes of one object's JSON read from the API server (etcd keeps objects of <= 1.5 MiB)


class KubeConfigError(StartupError, RuntimeError):
    """No usable cluster configuration; the message says which source failed."""


def config_source(kubeconfig: str | None = None) -> tuple[str | None, str]:
    """(kubeconfig files or None for in-cluster, how it was chosen), in kubectl's order:
    `--kubeconfig`, then `$KUBECONFIG` (files separated by ':', merged), then ~/.kube/config
    when it exists, else the pod's service account."""
    if kubeconfig:
        return kubeconfig, f"--kubeconfig {kubeconfig}"
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"], f"$KUBECONFIG ({os.environ['KUBECONFIG']})"
    home = os.path.expanduser("~/.kube/config")
    if os.path.isfile(home):
        return home, home
    return None, "the in-cluster service account (outside a pod: set --kubeconfig or $KUBECONFIG)"


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """A client from the configuration config_source() picks."""
    files, source = config_source(kubeconfig)
    try:
        if files:
            from_file: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=files)
            return from_file
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return client.ApiClient(cfg)
    except (config.ConfigException, OSError, yaml.YAMLError, ValueError) as e:
        raise KubeConfigError(f"cannot load the Kubernetes configuration from {source}: {e}") from None
    except (TypeError, AttributeError):  # how the client's loader fails on YAML that is no mapping
        raise KubeConfigError(f"cannot load the Kubernetes configuration from {source}: not a kubeconfig "
                              "(a YAML mapping with clusters, contexts and users)") from None


def no_request_retries(api: client.ApiClient) -> None:
    """Make urllib3 send each request of `api` once, and let api_deadline() bound it. By default
    it repeats a GET that failed on the way (a read that timed out included) three times, so a
    request bounded to T seconds could take 4 T against a hung API server: Prepare took 80 s,
    long after the kubelet had given up on the call (issue 26). Every caller here bounds its own
    time and retries on its own."""
    pools = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    if pools is not None:
        pools.connection_pool_kw["retries"] = False
        pools.pool_classes_by_scheme = {scheme: _watched_pool(pool)  # a proxy manager's own pools too
                                        for scheme, pool in pools.pool_classes_by_scheme.items()}
        pools.clear()  # pools made before keep the old setting


class ApiDeadlineExceeded(TimeoutError):
    """An API call's whole exchange did not end within its deadline (api_deadline)."""


class _Deadline:
    """One call's deadline and the sockets it used, each held as a duplicate of its own (the
    connection may close its socket meanwhile; a duplicate is never another socket's number)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            if self._closed:
                return
            try:  # not sock.dup(): an SSLSocket refuses it
                dup = socket.socket(fileno=os.dup(sock.fileno()))
            except OSError:  # closed already: nothing left to wait on
                return
            self._sockets.append(dup)
            if self.expired:
                _shut(dup)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._closed = True
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()


def _shut(sock: socket.socket) -> None:
    """End every wait on the socket now (its connection's recv returns end of file)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed by the peer already
        pass


_calling = threading.local()  # .deadline: the _Deadline of the call this thread is in, if any


@contextmanager
def api_deadline(seconds: float) -> Iterator[None]:
    """Bound every API call made in the block, on a client prepared by no_request_retries(), to
    `seconds` all together: connecting, sending, the headers and the body. urllib3's timeouts
    bound each socket operation, not the exchange: a server that sent a byte every 4 s held
    Prepare 88 s. When the time is up the block's sockets are shut down, so whatever it waits on
    returns at once, and the failure raised is ApiDeadlineExceeded."""
    deadline = _Deadline(seconds)
    outer, _calling.deadline = getattr(_calling, "deadline", None), deadline
    try:
        yield
    except Exception as e:
        if deadline.expired or isinstance(e, urllib3.exceptions.TimeoutError):
            raise ApiDeadlineExceeded(f"no answer within {seconds:g} s (connecting, sending, the headers "
                                      "and the body together)") from None
        raise
    finally:
        _calling.deadline = outer  # an enclosing block's sockets join it again
        deadline.close()


def _watch(sock: socket.socket) -> None:
    deadline: _Deadline | None = getattr(_calling, "deadline", None)
    if deadline is not None:
        deadline.watch(sock)


class _Watched:
    """A urllib3 connection whose socket joins the calling thread's api_deadline, when it has one."""

    sock: socket.socket | None

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        _watch(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        if self.sock is not None:  # a connection the pool kept: no _new_conn this time
            _watch(self.sock)
        super().request(*args, **kwargs)  # type: ignore[misc]


@functools.cache
def _watched_pool(pool: type[urllib3.HTTPConnectionPool]) -> type[urllib3.HTTPConnectionPool]:
    """`pool` with connections whose sockets join the calling thread's api_deadline."""
    if issubclass(pool.ConnectionCls, _Watched):
        return pool
    connection = type(f"Watched{pool.ConnectionCls.__name__}", (_Watched, pool.ConnectionCls), {})
    return type(f"Watched{pool.__name__}", (pool,), {"ConnectionCls": connection})


def read_body(response: Any, limit: int) -> bytes:
    """The body of a `_preload_content=False` response, refused past `limit` bytes (ValueError):
    a server's answer never takes more memory than that."""
    data: bytes = response.read(limit + 1)
    if len(data) > limit:
        response.close()
        raise ValueError(f"an answer of over {limit} bytes")
    return data


def json_body(response: Any) -> JSON:
    """The body of a `_preload_content=False` response as plain JSON.

    We work on plain dicts (the API's own JSON) rather than the client's models, so what we
    compare and send is exactly what the server stores, fields this client does not know included.
    """
    body: JSON = json.loads(response.data)
    return body


def plain(body: JSON) -> Any:
    """`body` for a client method typed for a model object: the client sends a dict as it is,
    so the server gets exactly the JSON we built (json_body's other half)."""
    return body


def _status(exc: client.ApiException) -> JSON:
    """The Status object the server sent with the error ({} when the body is not one)."""
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def status_reason(exc: client.ApiException) -> str:
    """The `reason` of a Status body (NotFound, Conflict, ...), or the HTTP status text."""
    return _status(exc).get("reason") or str(exc.reason)


def api_error(exc: client.ApiException) -> str:
    """`HTTP 422 Invalid: <the server's message>`: what failed, as the API server explains it
    (which field, which value), for logs and errors."""
    message = _status(exc).get("message")
    return f"HTTP {exc.status} {status_reason(exc)}" + (f": {message}" if message else "")


def rfc3339_now() -> str:
    """Now as the API's timestamps write it (metav1.Time: seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def warning_event(involved: dict[str, str], reason: str, message: str, *, namespace: str, component: str,
                  reporting_component: str, host: str, name: str | None = None, event_type: str = "Warning") -> JSON:
    """A Warning (or `event_type`) Event body about `involved` (an object reference), where
    `kubectl describe` shows it. Named `name`, or by the server after the object (`<involved name>.<suffix>`)."""
    now = rfc3339_now()
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"namespace": namespace, **({"name": name} if name else {"generateName": f"{involved['name']}."})},
        "involvedObject": involved, "reason": reason, "message": message, "type": event_type, "count": 1,
        "firstTimestamp": now, "lastTimestamp": now,
        "source": {"component": component, "host": host},
        "reportingComponent": reporting_component, "reportingInstance": host,
    }
