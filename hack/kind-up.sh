#!/usr/bin/env bash
# Create a kind cluster with DRA consumable capacity and CDI, build and load the driver
# image, and deploy the driver with simulated GPUs (deploy/overlays/mock).
# Needs: docker, kind (>= 0.30), kubectl. Not run in CI (no Docker there); the same scenario
# runs locally without a cluster in tests/e2e and `gpushare-dra demo`.
#
#   hack/kind-up.sh [CLUSTER_NAME]     (default gpushare; K8S_IMAGE=kindest/node:v1.34.0 to pin)
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:-gpushare}"
node_image="${K8S_IMAGE:-kindest/node:v1.34.0}"
image="gpushare-dra:dev"

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "kind-up: $tool is required" >&2; exit 1; }
done
# Render first: a manifest kustomize refuses fails here, before minutes of cluster and image work.
kubectl kustomize deploy/overlays/mock >/dev/null

if ! kind get clusters | grep -qx "$name"; then
  cat <<YAML | kind create cluster --name "$name" --image "$node_image" --config -
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
# Feature gates apply to the apiserver, scheduler, controller-manager and kubelet alike.
featureGates:
  DynamicResourceAllocation: true
  DRAConsumableCapacity: true
  DRADeviceTaints: true
runtimeConfig:
  resource.k8s.io/v1: "true"
containerdConfigPatches:
# CDI is how the kubelet plugin hands devices to containers.
- |-
  [plugins."io.containerd.grpc.v1.cri"]
    enable_cdi = true
    cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
nodes:
- role: control-plane
- role: worker
YAML
fi

docker build -t "$image" .
kind load docker-image "$image" --name "$name"
kubectl apply -k deploy/overlays/mock
kubectl -n gpushare-system rollout status daemonset/gpushare-kubelet-plugin --timeout=180s
echo "waiting for ResourceSlices of gpushare.dev"
for _ in $(seq 60); do
  kubectl get resourceslices --field-selector spec.driver=gpushare.dev -o name | grep -q . && break
  sleep 2
done
kubectl get resourceslices --field-selector spec.driver=gpushare.dev
echo "cluster $name is ready: hack/e2e-kind.sh runs the end-to-end scenario"
