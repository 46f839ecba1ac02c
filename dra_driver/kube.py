"""Kubernetes API access shared by every role: one way to build a client."""

from __future__ import annotations

from typing import Any

from kubernetes import client, config

JSON = dict[str, Any]  # an object as the API server's JSON, not the client's model


class KubeConfigError(RuntimeError):
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


def status_reason(exc: client.ApiException) -> str:
    """The `reason` of a Status body (NotFound, Conflict, ...), or the HTTP status text."""
    import json

    try:
        return json.loads(exc.body or "{}").get("reason") or str(exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)
