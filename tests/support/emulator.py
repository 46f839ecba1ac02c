"""Helpers of the emulator tests: API object bodies and raw HTTP requests. The fixtures are in
tests/emulator/conftest.py."""

import json
import urllib.error
import urllib.request


def slice_body(name="slice-a", node="node-a", devices=None, driver="gpu.example.com"):
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"node": node}},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices if devices is not None else [{"name": "gpu-0"}]},
    }


def claim_body(name="claim-a", capacity=None):
    exactly = {"deviceClassName": "gpu.example.com"}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod_body(name="pod-a", node="node-a", labels=None):
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}


def http(emu, method, path, body=None, content_type="application/json", headers=None):
    """(code, headers, answer) of a raw request: for what the clients cannot send or show
    (unknown fields, apply patches, Accept headers, Warning headers). answer is the parsed
    JSON, or the text when it is not JSON."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(f"{emu.url}{path}", data, {"Content-Type": content_type, **(headers or {})},
                                     method=method)
    try:
        with urllib.request.urlopen(request) as answer:
            code, headers, raw = answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as error:
        code, headers, raw = error.code, error.headers, error.read()
    try:
        return code, headers, json.loads(raw)
    except ValueError:
        return code, headers, raw.decode()
