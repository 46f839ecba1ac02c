"""dra_driver.kube: which cluster configuration a command uses, and API errors as the server explains them."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from dra_driver import kube


def test_kubeconfig_flag_then_env_then_home_then_in_cluster(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert kube.config_source()[0] is None and "in-cluster" in kube.config_source()[1]
    home = tmp_path / ".kube" / "config"
    home.parent.mkdir()
    home.write_text("{}")
    assert kube.config_source() == (str(home), str(home))
    monkeypatch.setenv("KUBECONFIG", "/a/config:/b/config")  # kubectl's list of files, merged
    assert kube.config_source()[0] == "/a/config:/b/config"
    assert kube.config_source("/flag/config")[0] == "/flag/config"


def test_kubeconfig_env_is_used_and_named_when_it_fails(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(kube.KubeConfigError, match=r"\$KUBECONFIG"):
        kube.api_client()
    config = tmp_path / "config"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://10.9.8.7:6443"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert kube.api_client().configuration.host == "https://10.9.8.7:6443"


def test_api_error_carries_the_servers_message():
    e = client.ApiException(status=422, reason="Unprocessable Entity")
    e.body = json.dumps({"kind": "Status", "reason": "Invalid",
                         "message": 'ResourceSlice.resource.k8s.io "n" is invalid: spec.nodeName: Invalid value: "x"'})
    assert kube.api_error(e) == ('HTTP 422 Invalid: ResourceSlice.resource.k8s.io "n" is invalid: '
                                 'spec.nodeName: Invalid value: "x"')
    bare = client.ApiException(status=503, reason="Service Unavailable")
    assert kube.api_error(bare) == "HTTP 503 Service Unavailable"
