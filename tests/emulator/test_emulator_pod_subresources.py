"""pods/binding (what the scheduler writes) and pods/log (what `kubectl logs` reads)."""

import json

import pytest
from kubernetes import client

from tests.support.emulator import pod_body

BINDING = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "pod-a"},
           "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}


def unbound_pod():
    body = pod_body()
    del body["spec"]["nodeName"]  # as created: the scheduler binds it
    return body


def test_binding_sets_node_and_scheduled_condition_once(core):
    core.create_namespaced_pod("default", unbound_pod())
    core.create_namespaced_pod_binding("pod-a", "default", BINDING, _preload_content=False)
    pod = core.read_namespaced_pod("pod-a", "default")
    assert pod.spec.node_name == "node-a"
    assert [(c.type, c.status) for c in pod.status.conditions] == [("PodScheduled", "True")]
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_pod_binding("pod-a", "default", {**BINDING, "target": {"kind": "Node", "name": "b"}},
                                           _preload_content=False)
    assert err.value.status == 409
    assert json.loads(err.value.body)["message"] == ('Operation cannot be fulfilled on pods/binding "pod-a": '
                                                     'pod pod-a is already assigned to node "node-a"')


def test_binding_needs_a_node_target(core):
    core.create_namespaced_pod("default", unbound_pod())
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_pod_binding("pod-a", "default", {**BINDING, "target": {"kind": "Pod", "name": "x"}},
                                           _preload_content=False)
    assert err.value.status == 422 and "target" in json.loads(err.value.body)["message"]
    assert core.read_namespaced_pod("pod-a", "default").spec.node_name is None


def test_log_reads_the_node_and_names_a_bad_container(emu, core):
    core.create_namespaced_pod("default", unbound_pod())
    with pytest.raises(client.ApiException) as err:
        core.read_namespaced_pod_log("pod-a", "default")
    assert err.value.status == 400 and "no node runs it" in json.loads(err.value.body)["message"]
    emu.pod_logs = lambda namespace, pod, container: f"{namespace}/{pod}/{container} says hi\n"
    core.create_namespaced_pod_binding("pod-a", "default", BINDING, _preload_content=False)
    (container,) = [c.name for c in core.read_namespaced_pod("pod-a", "default").spec.containers]
    assert core.read_namespaced_pod_log("pod-a", "default") == f"default/pod-a/{container} says hi\n"
    with pytest.raises(client.ApiException) as err:
        core.read_namespaced_pod_log("pod-a", "default", container="nope")
    assert json.loads(err.value.body)["message"] == "container nope is not valid for pod pod-a"
