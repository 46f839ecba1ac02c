"""Server-side printing: the meta.k8s.io/v1 Table that `kubectl get` asks for (Accept:
application/json;as=Table;g=meta.k8s.io;v=v1), with the real server's columns."""

import datetime

NAME = {"name": "Name", "type": "string", "format": "name",
        "description": "Name must be unique within a namespace."}
AGE = {"name": "Age", "type": "string", "format": "",
       "description": "CreationTimestamp is a timestamp representing the server time when this "
                      "object was created."}


def _column(name, description, type_="string"):
    return {"name": name, "type": type_, "format": "", "description": description}


def wants_table(accept):
    """True when the Accept header asks for a meta.k8s.io/v1 Table first."""
    first = (accept or "").split(",")[0]
    params = {p.strip() for p in first.split(";")[1:]}
    return {"as=Table", "g=meta.k8s.io", "v=v1"} <= params


def age(timestamp, now=None):
    """'5s', '3m', '2h', '4d': kubectl's short human duration of the time since timestamp."""
    if not timestamp:
        return "<unknown>"
    created = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.UTC)
    seconds = int(((now or datetime.datetime.now(datetime.UTC)) - created)
                  .total_seconds())
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 120 * 60:
        return f"{seconds // 60}m"
    if seconds < 48 * 3600:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def claim_state(claim):
    """STATE of a ResourceClaim as the real printer words it: pending, allocated,reserved, ..."""
    states = []
    deleted = bool(claim["metadata"].get("deletionTimestamp"))
    if deleted:
        states.append("deleted")
    status = claim.get("status") or {}
    if not status.get("allocation"):
        if not deleted:
            states.append("pending")
    else:
        states.append("allocated")
        if status.get("reservedFor"):
            states.append("reserved")
    return ",".join(states)


def _pod_cells(pod):
    status = pod.get("status") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    reason = status.get("reason") or status.get("phase") or ""
    for c in statuses:  # a waiting or failed container names why, as kubectl shows it
        state = c.get("state") or {}
        detail = (state.get("waiting") or {}).get("reason") or \
            (state.get("terminated") or {}).get("reason")
        if detail:
            reason = detail
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    return [f"{ready}/{len(containers)}", reason, restarts]


def _slice_cells(slice_obj):
    spec = slice_obj.get("spec") or {}
    return [spec.get("nodeName", ""), spec.get("driver", ""),
            (spec.get("pool") or {}).get("name", "")]


def _node_cells(node):
    conditions = {c.get("type"): c.get("status") for c in
                  (node.get("status") or {}).get("conditions") or []}
    status = {"True": "Ready", "False": "NotReady"}.get(conditions.get("Ready") or "", "Unknown")
    if (node.get("spec") or {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    prefix = "node-role.kubernetes.io/"
    roles = sorted(k[len(prefix):] for k in node["metadata"].get("labels") or {}
                   if k.startswith(prefix))
    version = ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")
    return [status, ",".join(roles) or "<none>"], [version]


def _daemonset_cells(ds):
    status = ds.get("status") or {}
    selector = ((ds.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector")
    counts = [int(status.get(f) or 0) for f in (
        "desiredNumberScheduled", "currentNumberScheduled", "numberReady",
        "updatedNumberScheduled", "numberAvailable")]
    return [*counts, ",".join(f"{k}={v}" for k, v in (selector or {}).items()) or "<none>"]


# kind -> (columns between NAME and AGE, cells for them)
PRINTERS = {
    "ResourceClaim": ([_column("State", "A summary of the current state (allocated, pending, "
                                        "reserved, etc.).")],
                      lambda o: [claim_state(o)]),
    "ResourceSlice": ([_column("Node", "The node that provides the resources of the slice."),
                       _column("Driver", "The driver that publishes the slice."),
                       _column("Pool", "The pool that the slice belongs to.")], _slice_cells),
    "DeviceClass": ([], lambda o: []),
    "Namespace": ([_column("Status", "The status of the namespace")],
                  lambda o: [(o.get("status") or {}).get("phase", "")]),
    "DaemonSet": ([_column(n, d, "integer") for n, d in (
        ("Desired", "The desired number of pods."), ("Current", "The current number of pods."),
        ("Ready", "The number of pods ready."), ("Up-to-date", "The number of pods updated."),
        ("Available", "The number of pods available."))]
        + [_column("Node Selector", "Which nodes are eligible to run pods.")], _daemonset_cells),
    "Pod": ([_column("Ready", "The aggregate readiness state of this pod for accepting "
                              "traffic."),
             _column("Status", "The aggregate status of the containers in this pod."),
             _column("Restarts", "The number of times the containers in this pod have been "
                                 "restarted and when the last container in this pod has "
                                 "restarted.", "integer")], _pod_cells),
}


def _partial_metadata(obj):
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"]}


def table(rt, objects, list_metadata, include_object="PartialObjectMetadata"):
    """The Table of objects of type rt; kinds without a printer get the server's default
    columns (NAME, CREATED AT)."""
    if rt.kind == "Node":  # the one table with a column after AGE
        columns = [NAME, _column("Status", "The status of the node"),
                   _column("Roles", "The roles of the node"), AGE,
                   _column("Version", "Kubelet Version reported by the node.")]

        def row(o):
            before, after = _node_cells(o)
            return [o["metadata"]["name"], *before, age(o["metadata"].get("creationTimestamp")),
                    *after]
    elif rt.kind in PRINTERS:
        extra, cells = PRINTERS[rt.kind]
        columns = [NAME, *extra, AGE]

        def row(o):
            return [o["metadata"]["name"], *cells(o), age(o["metadata"].get("creationTimestamp"))]
    else:
        columns = [NAME, {"name": "Created At", "type": "date", "format": "",
                          "description": AGE["description"]}]

        def row(o):
            return [o["metadata"]["name"], o["metadata"].get("creationTimestamp")]
    rows = []
    for o in objects:
        entry = {"cells": row(o)}
        if include_object == "Object":
            entry["object"] = {"apiVersion": rt.api_version, "kind": rt.kind, **o}
        elif include_object != "None":
            entry["object"] = _partial_metadata(o)
        rows.append(entry)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_metadata,
            "columnDefinitions": [{**c, "priority": 0} for c in columns], "rows": rows}
