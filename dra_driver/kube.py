"""Kubernetes API access shared by every role: one way to build a client, read a raw response,
name a failure and build an Event."""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

import yaml
from kubernetes import client, config

from .flags import StartupError

JSON = dict[str, Any]  # an object as the API server's JSON, not the client's model
# A background thread's API call gives up after this long: a hung API server must not hold the
# node agent's threads, or the plugin's shutdown (which joins them), for ever.
BACKGROUND_API_TIMEOUT_S = 10


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
    """Make urllib3 send each request of `api` once. By default it repeats a GET that failed on
    the way (a read that timed out included) three times, so a request bounded to T seconds
    could take 4 T against a hung API server: Prepare took 80 s, long after the kubelet had given
    up on the call (issue 26). Every caller here bounds its own time and retries on its own."""
    pools = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    if pools is not None:
        pools.connection_pool_kw["retries"] = False
        pools.clear()  # pools made before keep the old setting


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
