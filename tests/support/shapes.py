"""Hand-built API objects (camelCase dicts) in the shapes docs/contract.md fixes for gpushare.dev."""

import copy
import uuid

from playground.claims import DRIVER

NODE = "node-1"  # the allocation tests' node (the plugin suites' is claims.NODE)
GiB = 2**30
MiB = 2**20


def _attributes(index, sharing, product="NVIDIA H100 80GB HBM3"):
    return {
        "uuid": {"string": f"GPU-{index:04d}"},
        "index": {"int": index},
        "productName": {"string": product},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "550.54.15"},
        "sharing": {"string": sharing},
    }


def capacity_device(index, memory="80Gi", product="NVIDIA H100 80GB HBM3", taints=None):
    device = {
        "name": f"gpu-{index}",
        "allowMultipleAllocations": True,
        "attributes": _attributes(index, "capacity", product),
        "capacity": {
            "memory": {"value": memory, "requestPolicy": {
                "default": "1Gi", "validRange": {"min": "256Mi", "max": memory, "step": "256Mi"}}},
            "compute": {"value": "100", "requestPolicy": {
                "default": "10", "validRange": {"min": "1", "max": "100", "step": "1"}}},
        },
    }
    if taints:
        device["taints"] = taints
    return device


def partition_devices(index, shares=8, memory_gib=80, product="NVIDIA H100 80GB HBM3"):
    return [{
        "name": f"gpu-{index}-share-{j}",
        "attributes": _attributes(index, "partition", product),
        "capacity": {"memory": {"value": f"{memory_gib // shares}Gi"}, "compute": {"value": str(100 // shares)}},
    } for j in range(shares)]


def resource_slice(devices, node=NODE, generation=1, name=None, slice_count=1, driver=DRIVER):
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}-g{generation}"},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": slice_count},
                 "devices": devices},
    }


def capacity_slice(gpus=1, **kwargs):
    return resource_slice([capacity_device(i) for i in range(gpus)], **kwargs)


def partition_slice(gpus=1, shares=8, **kwargs):
    return resource_slice([d for i in range(gpus) for d in partition_devices(i, shares)], **kwargs)


def device_class(name=DRIVER, selectors=(f'device.driver == "{DRIVER}"',), config=None):
    spec = {"selectors": [{"cel": {"expression": e}} for e in selectors]}
    if config:
        spec["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def opaque(**parameters):
    return {"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "gpushare.dev/v1alpha1", "kind": "GpuShareConfig", **parameters}}}


def _request_spec(device_class_name=DRIVER, count=None, mode=None, selectors=(), capacity=None, tolerations=None):
    spec = {"deviceClassName": device_class_name}
    if count is not None:
        spec["count"] = count
    if mode:
        spec["allocationMode"] = mode
    if selectors:
        spec["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity:
        spec["capacity"] = {"requests": capacity}
    if tolerations:
        spec["tolerations"] = tolerations
    return spec


def exactly(name="gpu", **kwargs):
    return {"name": name, "exactly": _request_spec(**kwargs)}


def subrequest(name, **kwargs):
    return {"name": name, **_request_spec(**kwargs)}


def first_available(name, *subrequests):
    return {"name": name, "firstAvailable": list(subrequests)}


def claim(*requests, name=None, constraints=None, config=None, namespace="default"):
    devices = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name or f"claim-{uuid.uuid4().hex[:6]}", "namespace": namespace,
                     "uid": str(uuid.uuid4())},
        "spec": {"devices": devices},
    }


def with_status(a_claim, status):
    allocated = copy.deepcopy(a_claim)
    allocated["status"] = status
    return allocated


def pod(name="pod-a"):
    return {"metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())}}


def allocate_on(a_claim, slices, classes=None, allocated=(), pod=None, node=NODE):
    """allocate() with this module's defaults: the shipped class, nothing else allocated."""
    from playground.allocator import allocate
    return allocate(a_claim, node_name=node, slices=slices, device_classes=classes or [device_class()],
                    allocated_claims=list(allocated), pod=pod)


def results(status):
    return status["allocation"]["devices"]["results"]
