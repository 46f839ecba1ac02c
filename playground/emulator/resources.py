"""The resource types the emulator serves, and the discovery documents built from them."""

from dataclasses import dataclass, field

CORE_FIELD_SELECTORS = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False
    short_names: tuple = ()
    categories: tuple = ()  # ("all",): listed by `kubectl get all`
    # Field paths usable in fieldSelector besides metadata.name/namespace, as the real server allows.
    extra_field_selectors: tuple = ()
    verbs: tuple = field(default=(
        "create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"))

    @property
    def api_version(self):
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified_name(self):
        """'pods' or 'resourceslices.resource.k8s.io', as used in error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def field_selectors(self):
        return CORE_FIELD_SELECTORS + self.extra_field_selectors


RESOURCE_TYPES = (
    ResourceType("", "v1", "nodes", "Node", namespaced=False, has_status=True,
                 short_names=("no",), extra_field_selectors=("spec.unschedulable",)),
    ResourceType("", "v1", "pods", "Pod", namespaced=True, has_status=True, short_names=("po",),
                 categories=("all",),
                 extra_field_selectors=("spec.nodeName", "spec.schedulerName", "status.phase",
                                        "status.nominatedNodeName")),
    ResourceType("", "v1", "events", "Event", namespaced=True, short_names=("ev",),
                 extra_field_selectors=("involvedObject.kind", "involvedObject.name",
                                        "involvedObject.namespace", "involvedObject.uid",
                                        "reason", "type", "source")),
    ResourceType("events.k8s.io", "v1", "events", "Event", namespaced=True, short_names=("ev",),
                 extra_field_selectors=("regarding.kind", "regarding.name",
                                        "regarding.namespace", "regarding.uid",
                                        "reason", "type")),
    ResourceType("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False,
                 extra_field_selectors=("spec.nodeName", "spec.driver")),
    ResourceType("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False),
    ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True,
                 has_status=True),
    ResourceType("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate",
                 namespaced=True),
    # What `kubectl apply -k deploy/` creates besides the above: stored and served generically.
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, has_status=True,
                 short_names=("ns",), extra_field_selectors=("status.phase",)),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True,
                 short_names=("sa",)),
    ResourceType("", "v1", "services", "Service", namespaced=True, has_status=True,
                 short_names=("svc",), categories=("all",)),
    ResourceType("", "v1", "configmaps", "ConfigMap", namespaced=True, short_names=("cm",)),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", namespaced=True, has_status=True,
                 short_names=("ds",), categories=("all",)),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole",
                 namespaced=False),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
                 namespaced=False),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding",
                 namespaced=True),
    ResourceType("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies",
                 "ValidatingAdmissionPolicy", namespaced=False, has_status=True),
    ResourceType("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                 "ValidatingAdmissionPolicyBinding", namespaced=False),
    ResourceType("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                 "ValidatingWebhookConfiguration", namespaced=False),
    # deploy/components/network-policy (docs/operations.md's recommended overlay)
    ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", namespaced=True,
                 short_names=("netpol",)),
)

# (group, version, plural) -> ResourceType
BY_PATH = {(rt.group, rt.version, rt.plural): rt for rt in RESOURCE_TYPES}


def group_versions():
    """{group: [version, ...]} for the named (non-core) groups, in declaration order."""
    groups: dict[str, list[str]] = {}
    for rt in RESOURCE_TYPES:
        if rt.group and rt.version not in groups.setdefault(rt.group, []):
            groups[rt.group].append(rt.version)
    return groups


def api_versions_doc(server_address):
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                            "serverAddress": server_address}]}


def api_group_doc(group, versions):
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs,
            "preferredVersion": gvs[0]}


def api_group_list_doc():
    groups = [api_group_doc(g, vs) for g, vs in group_versions().items()]
    for g in groups:
        del g["kind"], g["apiVersion"]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_resource_list_doc(group, version):
    """APIResourceList for one group/version, or None when it is not served."""
    resources = []
    for rt in RESOURCE_TYPES:
        if (rt.group, rt.version) != (group, version):
            continue
        entry = {"name": rt.plural, "singularName": rt.kind.lower(), "namespaced": rt.namespaced,
                 "kind": rt.kind, "verbs": list(rt.verbs)}
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        if rt.has_status:
            resources.append({"name": f"{rt.plural}/status", "singularName": "",
                              "namespaced": rt.namespaced, "kind": rt.kind,
                              "verbs": ["get", "patch", "update"]})
    if not resources:
        return None
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": resources}


def version_doc(kube_version):
    major, minor = kube_version.split(".")[:2]
    return {"major": major, "minor": minor, "gitVersion": f"v{major}.{minor}.0-emulator",
            "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25", "compiler": "gc",
            "platform": "linux/amd64"}
