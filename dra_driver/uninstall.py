"""`gpushare-dra uninstall-check`: may the driver go now? Not while claims of it are in use.

A claim whose pods run (or wait to start) on a node is prepared there by the node's plugin, and
only the plugin can unprepare it: once the plugin is gone, the kubelet cannot finish deleting
those pods (they hang in Terminating until a plugin is back). So an uninstall first asks this
command, as the Helm chart's pre-delete hook does: it names each claim in use and exits 1, so
`helm uninstall` stops with the plugin still running. With --force (or the plugin's DaemonSet,
--daemonset, annotated gpushare.dev/uninstall=force: what a refused `helm uninstall` can still
be told, as its release can no longer be upgraded) it deletes the pods that use them instead and
waits until the plugin has unprepared every claim, then exits 0: the uninstall goes on cleanly
(docs/operations.md, Uninstall).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from kubernetes import client

from .kube import JSON, api_client, api_error, json_body
from .log import get_logger

log = get_logger("uninstall-check")

POLL_S = 1.0
FORCE_ANNOTATION = "gpushare.dev/uninstall"  # "force" on the DaemonSet named by --daemonset
REQUEST_TIMEOUT = (5, 30)


@dataclass(frozen=True)
class ClaimInUse:
    namespace: str
    name: str
    nodes: tuple[str, ...]  # the pools (nodes) of its devices
    pods: tuple[str, ...]  # the pods it is reserved for

    def describe(self) -> str:
        pods = ", ".join(self.pods) if self.pods else "no pod any more, still prepared"
        return f"{self.namespace}/{self.name} (node {', '.join(self.nodes)}; pods {pods})"


def claims_in_use(claims: list[JSON], driver: str) -> list[ClaimInUse]:
    """The claims with a device of `driver` that pods use, or that a plugin has prepared
    (our entry in status.devices, which Unprepare removes)."""
    found = []
    for claim in claims:
        status = claim.get("status") or {}
        results = [r for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
                   if r.get("driver") == driver]
        if not results:
            continue
        pods = tuple(sorted(r.get("name", "") for r in status.get("reservedFor") or [] if r.get("resource") == "pods"))
        prepared = any(d.get("driver") == driver for d in status.get("devices") or [])
        if pods or prepared:
            meta = claim["metadata"]
            found.append(ClaimInUse(meta.get("namespace", ""), meta["name"],
                                    tuple(sorted({r.get("pool", "") for r in results})), pods))
    return sorted(found, key=lambda c: (c.namespace, c.name))


def list_claims(api: client.ApiClient) -> list[JSON]:
    response = client.ResourceV1Api(api).list_resource_claim_for_all_namespaces(
        _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
    items: list[JSON] = json_body(response).get("items") or []
    return items


def delete_pods(api: client.ApiClient, in_use: list[ClaimInUse]) -> None:
    core = client.CoreV1Api(api)
    for claim in in_use:
        for pod in claim.pods:
            try:
                core.delete_namespaced_pod(pod, claim.namespace, _request_timeout=REQUEST_TIMEOUT)
                log.info("deleted a pod that uses a claim", pod=f"{claim.namespace}/{pod}", claim=claim.name)
            except client.ApiException as e:
                if e.status != 404:
                    raise


def annotated_force(api: client.ApiClient, daemonset: str) -> bool:
    """The DaemonSet NAMESPACE/NAME carries gpushare.dev/uninstall=force (a gone one does not)."""
    namespace, name = daemonset.split("/", 1)
    try:
        ds = json_body(client.AppsV1Api(api).read_namespaced_daemon_set(
            name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))
    except client.ApiException as e:
        if e.status == 404:
            return False
        raise
    return bool((ds["metadata"].get("annotations") or {}).get(FORCE_ANNOTATION) == "force")


def check(api: client.ApiClient, driver: str, force: bool, timeout: float, daemonset: str | None = None) -> int:
    in_use = claims_in_use(list_claims(api), driver)
    if not in_use:
        print(f"gpushare-dra uninstall-check: no claim of {driver} is in use; the driver may go", file=sys.stderr)
        return 0
    names = "; ".join(c.describe() for c in in_use)
    force = force or bool(daemonset and annotated_force(api, daemonset))
    if not force:
        if daemonset:
            namespace, name = daemonset.split("/", 1)
            how = (f"let the uninstall delete them: kubectl -n {namespace} annotate daemonset/{name} "
                   f"{FORCE_ANNOTATION}=force, then helm uninstall again")
        else:
            how = "let this delete them: gpushare-dra uninstall-check --force, then uninstall"
        print(f"gpushare-dra uninstall-check: {len(in_use)} claim(s) of {driver} in use: {names}. Their pods could "
              f"not finish terminating without the plugin. Delete those pods first (the plugin unprepares each "
              f"claim as its pod goes), or {how} (docs/operations.md, Uninstall)", file=sys.stderr)
        return 1
    print(f"gpushare-dra uninstall-check: --force: deleting the pods of {len(in_use)} claim(s) in use: {names}",
          file=sys.stderr)
    deadline = time.monotonic() + timeout
    while in_use:
        delete_pods(api, in_use)
        if time.monotonic() > deadline:
            print(f"gpushare-dra uninstall-check: after {timeout:.0f} s still in use: "
                  f"{'; '.join(c.describe() for c in in_use)}", file=sys.stderr)
            return 1
        time.sleep(POLL_S)
        in_use = claims_in_use(list_claims(api), driver)
    print("gpushare-dra uninstall-check: every claim unprepared; the driver may go", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return check(api_client(args.kubeconfig), args.driver_name, args.force, args.timeout, args.daemonset)
    except client.ApiException as e:
        print(f"gpushare-dra uninstall-check: cannot read ResourceClaims: {api_error(e)}", file=sys.stderr)
        return 1
