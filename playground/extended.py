"""Extended resources backed by DRA (KEP-5004): a pod that writes `resources.limits:
{gpushare.dev/share: 1}` and no ResourceClaim, as kube-scheduler and the kubelet handle it.

After k8s.io/kubernetes pkg/scheduler/framework/plugins/dynamicresources/
extendeddynamicresources.go and extended/cache.go (master after 1.36, where the feature is GA):

- a DeviceClass maps its `spec.extendedResourceName` and, always, the implicit name
  `deviceclass.resource.kubernetes.io/<class>` to itself;
- a container's request for such a resource (the API server defaults requests from limits)
  becomes one device request `container-<i>-request-<j>` (i: the container's index in
  initContainers + containers, j: the resource's index in the container's sorted request
  names), ExactCount with the requested count, of that class; a non-sidecar init container
  reuses the requests of the long-lived containers after it where their count suffices;
- the claim: generateName `<pod>-extended-resources-`, annotation
  resource.kubernetes.io/extended-resource-claim "true", the pod as controller owner;
- pod.status.extendedResourceClaimStatus names the claim and maps (container, resource) to
  request; the kubelet prepares that claim too and gives each container the CDI devices of its
  mapped requests (pkg/kubelet/cm/dra/manager.go, GetResources).
"""

from __future__ import annotations

from kubernetes.utils import parse_quantity

from dra_driver.kube import JSON

from .names import DEVICE_CLASS_PREFIX, is_dra_extended_resource_name

CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"  # resourceapi.ExtendedResourceClaimAnnotation


def device_class_mapping(classes: list[JSON]) -> dict[str, str]:
    """{extended resource name: DeviceClass name}, explicit and implicit names (extended/cache.go).
    Two classes naming the same resource: the one first by name wins here (upstream leaves it
    to the informer's order); docs/emulator.md says to avoid it."""
    mapping: dict[str, str] = {}
    for device_class in sorted(classes, key=lambda c: c["metadata"]["name"], reverse=True):
        name = device_class["metadata"]["name"]
        mapping[DEVICE_CLASS_PREFIX + name] = name
        explicit = (device_class.get("spec") or {}).get("extendedResourceName")
        if explicit:
            mapping[explicit] = name
    return mapping


def container_requests(container: JSON) -> dict[str, int]:
    """The container's non-zero DRA extended resource requests, {name: count}."""
    found: dict[str, int] = {}
    for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
        if is_dra_extended_resource_name(name):
            count = parse_quantity(value)
            if count:
                found[name] = int(count)  # the API server admits integers only for these
    return found


def pod_requests(pod: JSON) -> dict[str, int]:
    """The pod's DRA extended resource requests: containers summed, init containers' maximum
    (resourcehelper.PodRequests without overhead)."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, count in container_requests(container).items():
            total[name] = total.get(name, 0) + count
    for container in spec.get("initContainers") or []:
        for name, count in container_requests(container).items():
            total[name] = max(total.get(name, 0), count)
    return total


def _container_request(index: int, container: JSON, resource: str, class_name: str,
                       reusable: list[JSON | None]) -> tuple[JSON | None, list[JSON]]:
    """createResourceRequestAndMappings: the container's own request for the resource (None
    when reusable requests cover it or it asks for none) and its mappings."""
    wanted = container_requests(container).get(resource, 0)
    if not wanted:
        return None, []
    mappings: list[JSON] = []
    covered = 0
    for request in reusable:
        if request is not None:
            covered += request["exactly"]["count"]
            mappings.append({"containerName": container["name"], "resourceName": resource,
                             "requestName": request["name"]})
            if covered >= wanted:
                return None, mappings
    names = sorted((container.get("resources") or {}).get("requests") or {})
    name = f"container-{index}-request-{names.index(resource)}"
    request = {"name": name, "exactly": {"deviceClassName": class_name, "allocationMode": "ExactCount",
                                         "count": wanted - covered}}
    mappings.append({"containerName": container["name"], "resourceName": resource, "requestName": name})
    return request, mappings


def requests_and_mappings(pod: JSON, resources: list[str], mapping: dict[str, str]) -> tuple[list[JSON], list[JSON]]:
    """createRequestsAndMappings: the claim's device requests (sorted by name) and the pod's
    requestMappings (per resource: long-lived containers', then short-lived init containers')."""
    spec = pod.get("spec") or {}
    inits = list(spec.get("initContainers") or [])
    containers = inits + list(spec.get("containers") or [])

    def short_lived(i: int) -> bool:  # an init container that is not a sidecar
        return i < len(inits) and containers[i].get("restartPolicy") != "Always"

    requests: list[JSON] = []
    mappings: list[JSON] = []
    for resource in sorted(resources):
        class_name = mapping.get(resource)
        if class_name is None:
            continue
        long_lived: list[JSON | None] = [None] * len(containers)
        long_mappings: list[JSON] = []
        for i, container in enumerate(containers):
            if not short_lived(i):
                long_lived[i], found = _container_request(i, container, resource, class_name, [])
                long_mappings += found
        largest: JSON | None = None
        short_names: set[str] = set()
        short_mappings: list[JSON] = []
        for i, container in enumerate(containers):
            if short_lived(i):
                request, found = _container_request(i, container, resource, class_name, long_lived[i:])
                if request is not None:
                    short_names.add(request["name"])
                    if largest is None or largest["exactly"]["count"] < request["exactly"]["count"]:
                        largest = request
                short_mappings += found
        if largest is not None:  # init containers run one at a time: the largest request serves them all
            for m in short_mappings:
                if m["requestName"] in short_names:
                    m["requestName"] = largest["name"]
            requests.append(largest)
        requests += [r for r in long_lived if r is not None]
        mappings += long_mappings + short_mappings
    return sorted(requests, key=lambda r: r["name"]), mappings


def claim_body(pod: JSON, requests: list[JSON]) -> JSON:
    """The special ResourceClaim the scheduler writes for the pod (createExtendedResourceClaimInAPI)."""
    meta = pod["metadata"]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {
        "generateName": f"{meta['name']}-extended-resources-", "namespace": meta["namespace"],
        "annotations": {CLAIM_ANNOTATION: "true"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                             "controller": True}]},
        "spec": {"devices": {"requests": requests}}}


def find_claim(pod: JSON, claims: list[JSON]) -> JSON | None:
    """findExtendedResourceClaim: the claim annotated as the pod's extended resource claim."""
    meta = pod["metadata"]
    for claim in claims:
        if (claim["metadata"].get("annotations") or {}).get(CLAIM_ANNOTATION) == "true" and any(
                o.get("controller") and o.get("name") == meta["name"] and o.get("uid") == meta["uid"]
                for o in claim["metadata"].get("ownerReferences") or []):
            return claim
    return None


def container_request_names(pod: JSON, container: JSON) -> list[str]:
    """The extended resource claim's requests whose devices this container gets (GetResources)."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    wanted = container_requests(container)
    return [m["requestName"] for m in status.get("requestMappings") or []
            if m.get("containerName") == container["name"] and m.get("resourceName") in wanted]

