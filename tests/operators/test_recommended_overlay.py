"""The overlay docs/operations.md recommends (deploy/ with network-policy)
validates with `kubectl apply --dry-run=client` and applies, against the API emulator: every kind
it holds is served, with its OpenAPI schema (a missing NetworkPolicy made kubectl's client-side
validation fail with "unable to respond with a content type")."""

from __future__ import annotations

import shutil

import yaml

from tests.support.deploy import DEPLOY
from tests.support.kubectl import Kubectl, needs_kubectl


@needs_kubectl
def test_the_recommended_overlay_validates_and_applies(emulator, tmp_path):
    shutil.copytree(DEPLOY, tmp_path / "gpushare-dra" / "deploy", symlinks=True,
                    ignore=shutil.ignore_patterns("overlays", "examples", "helm"))
    overlay = tmp_path / "gpushare"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../gpushare-dra/deploy"],
        "images": [{"name": "gpushare-dra", "newName": "registry.example.com/gpushare-dra", "newTag": "v0.1.0"}],
        "components": ["../gpushare-dra/deploy/components/network-policy"]}))
    k = Kubectl(tmp_path / "kubectl", kubeconfig=emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    dry = k.run("apply", "--dry-run=client", "-k", overlay, check=False)
    assert dry.returncode == 0, dry.stderr
    assert "networkpolicy.networking.k8s.io/gpushare-kubelet-plugin created (dry run)" in dry.stdout
    k("apply", "-k", overlay)
    assert k("get", "networkpolicy", "-n", "gpushare-system", "-o", "name").strip() == \
        "networkpolicy.networking.k8s.io/gpushare-kubelet-plugin"
