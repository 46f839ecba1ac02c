"""The scheduler's claim for extended resources backed by DRA (playground/extended.py),
case by case as k8s.io/kubernetes extendeddynamicresources.go builds it."""

from playground.extended import (
    claim_body,
    device_class_mapping,
    find_claim,
    pod_requests,
    requests_and_mappings,
)
from playground.names import is_dra_extended_resource_name, is_extended_resource_name

CLASSES = [{"metadata": {"name": "share.gpushare.dev"}, "spec": {"extendedResourceName": "gpushare.dev/share"}},
           {"metadata": {"name": "gpushare.dev"}, "spec": {}}]
MAPPING = device_class_mapping(CLASSES)


SHARE = "gpushare.dev/share"


def container(name, requests, restart=None):
    c = {"name": name, "resources": {"requests": requests}}
    return {**c, "restartPolicy": restart} if restart else c


def pod(containers, inits=()):
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u1"},
            "spec": {"containers": list(containers), "initContainers": list(inits)}}


def request(name, count, class_name="share.gpushare.dev"):
    return {"name": name, "exactly": {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": count}}


def mapping(container_name, request_name, resource="gpushare.dev/share"):
    return {"containerName": container_name, "resourceName": resource, "requestName": request_name}


def test_names_backed_by_dra():
    assert is_extended_resource_name("gpushare.dev/share") and is_extended_resource_name("nvidia.com/gpu")
    for native in ("cpu", "memory", "kubernetes.io/foo", "requests.gpushare.dev/share", "bad_domain/x"):
        assert not is_extended_resource_name(native), native
    assert is_dra_extended_resource_name("deviceclass.resource.kubernetes.io/gpushare.dev")
    assert MAPPING == {"gpushare.dev/share": "share.gpushare.dev",
                       "deviceclass.resource.kubernetes.io/share.gpushare.dev": "share.gpushare.dev",
                       "deviceclass.resource.kubernetes.io/gpushare.dev": "gpushare.dev"}


def test_one_request_per_container_and_resource_named_by_their_indexes():
    p = pod([container("a", {"cpu": "1", SHARE: "2"}),  # sorted: cpu, gpushare.dev/share -> index 1
             container("b", {"deviceclass.resource.kubernetes.io/gpushare.dev": "1"}),
             container("c", {"cpu": "1"})])
    assert pod_requests(p) == {"gpushare.dev/share": 2, "deviceclass.resource.kubernetes.io/gpushare.dev": 1}
    requests, mappings = requests_and_mappings(p, list(pod_requests(p)), MAPPING)
    assert requests == [request("container-0-request-1", 2), request("container-1-request-0", 1, "gpushare.dev")]
    assert mappings == [mapping("b", "container-1-request-0", "deviceclass.resource.kubernetes.io/gpushare.dev"),
                        mapping("a", "container-0-request-1")]


def test_init_containers_reuse_later_requests_and_share_the_largest_of_their_own():
    p = pod([container("main", {SHARE: "1"})],
            inits=[container("init-a", {SHARE: "3"}), container("init-b", {SHARE: "2"}),
                   container("sidecar", {SHARE: "1"}, restart="Always")])
    requests, mappings = requests_and_mappings(p, ["gpushare.dev/share"], MAPPING)
    # init-a: the sidecar's 1 and main's 1 are reused, 1 more of its own; init-b: reuses 2, needs none.
    assert requests == [request("container-0-request-0", 1), request("container-2-request-0", 1),
                        request("container-3-request-0", 1)]
    assert mappings == [mapping("sidecar", "container-2-request-0"), mapping("main", "container-3-request-0"),
                        mapping("init-a", "container-2-request-0"), mapping("init-a", "container-3-request-0"),
                        mapping("init-a", "container-0-request-0"),
                        mapping("init-b", "container-2-request-0"), mapping("init-b", "container-3-request-0")]
    assert pod_requests(p) == {"gpushare.dev/share": 3}  # containers summed (2), init containers' max (3)


def test_the_claim_is_found_by_annotation_and_controlling_owner():
    p = pod([container("a", {SHARE: "1"})])
    body = claim_body(p, [request("container-0-request-0", 1)])
    assert body["metadata"]["generateName"] == "p-extended-resources-"
    stored = {**body, "metadata": {**body["metadata"], "name": "p-extended-resources-x1"}}
    assert find_claim(p, [stored]) is stored
    other_pod = {**p, "metadata": {**p["metadata"], "uid": "u2"}}
    assert find_claim(other_pod, [stored]) is None
    unmarked = {**stored, "metadata": {**stored["metadata"], "annotations": {}}}
    assert find_claim(p, [unmarked]) is None
