"""Kubernetes API access shared by every role: one way to build a client, read a raw response,
name a failure and build an Event."""

from __future__ import annotations

import datetime
import json
from typing import Any

from kubernetes import client, config

from .flags import StartupError

JSON = dict[str, Any]  # an object as the API server's JSON, not the client's model
# A background thread's API call gives up after this long: a hung API server must not hold the
# node agent's threads, or the plugin's shutdown (which joins them), for ever.
BACKGROUND_API_TIMEOUT_S = 10


class KubeConfigError(StartupError, RuntimeError):
    """No usable cluster configuration; the message says which source failed."""


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """A client from `--kubeconfig`, or the in-cluster service account when unset."""
    try:
        if kubeconfig:
            from_file: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig)
            return from_file
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return client.ApiClient(cfg)
    except (config.ConfigException, OSError) as e:
        source = (f"--kubeconfig {kubeconfig}" if kubeconfig
                  else "the in-cluster service account (set --kubeconfig outside a pod)")
        raise KubeConfigError(f"cannot load the Kubernetes configuration from {source}: {e}") from None


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


def status_reason(exc: client.ApiException) -> str:
    """The `reason` of a Status body (NotFound, Conflict, ...), or the HTTP status text."""
    try:
        return json.loads(exc.body or "{}").get("reason") or str(exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


def warning_event(involved: dict[str, str], reason: str, message: str, *, namespace: str, component: str,
                  reporting_component: str, host: str, name: str | None = None) -> JSON:
    """A Warning Event body about `involved` (an object reference), where `kubectl describe`
    shows it. Named `name`, or by the server after the object (`<involved name>.<suffix>`)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"namespace": namespace, **({"name": name} if name else {"generateName": f"{involved['name']}."})},
        "involvedObject": involved, "reason": reason, "message": message, "type": "Warning", "count": 1,
        "firstTimestamp": now, "lastTimestamp": now,
        "source": {"component": component, "host": host},
        "reportingComponent": reporting_component, "reportingInstance": host,
    }
