"""What the deploy/ tests share: where the manifests are, the Kubernetes versions they are
validated against, and readers of rendered objects."""

from __future__ import annotations

import kubernetes_validate

from . import REPO

DEPLOY = REPO / "deploy"
VERSIONS = ["1.34", kubernetes_validate.utils.latest_version()]


def plugin_container(objects: list[dict]) -> tuple[dict, dict]:
    """(pod spec, plugin container) of the rendered DaemonSet."""
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def by_name(items: list[dict], key: str = "name") -> dict[str, dict]:
    return {item[key]: item for item in items}
