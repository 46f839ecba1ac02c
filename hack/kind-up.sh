#!/usr/bin/env bash
# Create a kind cluster with DRA and CDI, build and load the driver image, and deploy the
# driver with simulated GPUs (deploy/overlays/mock).
# Needs: docker, kind (>= 0.30 for 1.34, 0.31 for 1.35, 0.32 for 1.36, 0.33 for 1.37), kubectl.
# Not run in CI (no Docker there); the same scenario runs locally without a cluster in
# tests/e2e and `gpushare-dra demo`.
#
#   hack/kind-up.sh [--kube-version 1.34|1.35|1.36|1.37] [--dry-run] [CLUSTER_NAME]
#
# --kube-version (or KUBE_VERSION; the flag wins; default 1.37) picks the node image, pinned by
# digest as kind's release notes publish it (K8S_IMAGE=... overrides the image), and the feature
# gates that release needs: 1.36 and later need none (consumable capacity, device taints,
# extended resources and resource health are on by default); 1.34 and 1.35 turn on the alpha
# gates the driver uses. --dry-run prints the plan (image, gates, kind config) and does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: hack/kind-up.sh [--kube-version 1.34|1.35|1.36|1.37] [--dry-run] [CLUSTER_NAME]" >&2
  exit 2
}
kube_version="${KUBE_VERSION:-1.37}"
dry_run=false
name=gpushare
while [ $# -gt 0 ]; do
  case "$1" in
    --kube-version) [ $# -ge 2 ] || usage; kube_version="$2"; shift 2 ;;
    --kube-version=*) kube_version="${1#*=}"; shift ;;
    --dry-run) dry_run=true; shift ;;
    -*) usage ;;
    *) name="$1"; shift ;;
  esac
done

# Node images: the default image of the kind release that first shipped each minor (kind's
# pkg/apis/config/defaults/image.go at v0.30.0, v0.31.0 and v0.32.0; 1.37.0 as kind v0.33.0's
# release notes list it). Gates, from the upstream defaults (pkg/features/kube_features.go), alpha
# in 1.34/1.35 and on by default from 1.36: DRAConsumableCapacity (capacity mode),
# DRADeviceTaints (an unhealthy GPU is tainted, not left out), DRAExtendedResource (pods asking
# for gpushare.dev/... without a claim), ResourceHealthStatus (device health in pod status).
# DynamicResourceAllocation and resource.k8s.io/v1 are GA and on since 1.34.
alpha_gates="DRAConsumableCapacity DRADeviceTaints DRAExtendedResource ResourceHealthStatus"
case "$kube_version" in
  1.34) node_image=kindest/node:v1.34.0@sha256:7416a61b42b1662ca6ca89f02028ac133a309a2a30ba309614e8ec94d976dc5a
        gates="$alpha_gates" ;;
  1.35) node_image=kindest/node:v1.35.0@sha256:452d707d4862f52530247495d180205e029056831160e22870e37e3f6c1ac31f
        gates="$alpha_gates" ;;
  1.36) node_image=kindest/node:v1.36.1@sha256:3489c7674813ba5d8b1a9977baea8a6e553784dab7b84759d1014dbd78f7ebd5
        gates="" ;;
  1.37) node_image=kindest/node:v1.37.0@sha256:a1ed56cfb0e7b93589bdf97c8cd566405a265939e3620fc4f5de89adff580ae5
        gates="" ;;
  *) echo "kind-up: --kube-version: '$kube_version' is not supported (accepted: 1.34, 1.35, 1.36, 1.37)" >&2
     exit 2 ;;
esac
node_image="${K8S_IMAGE:-$node_image}"
image="gpushare-dra:dev"

kind_config() {
  echo "kind: Cluster"
  echo "apiVersion: kind.x-k8s.io/v1alpha4"
  if [ -n "$gates" ]; then
    echo "# Feature gates apply to the apiserver, scheduler, controller-manager and kubelet alike."
    echo "featureGates:"
    for gate in $gates; do echo "  $gate: true"; done
  fi
  cat <<'YAML'
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
}

if "$dry_run"; then
  echo "cluster: $name"
  echo "kube-version: $kube_version"
  echo "node-image: $node_image"
  echo "feature-gates: ${gates:-none}"
  echo "--- kind config"
  kind_config
  exit 0
fi

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "kind-up: $tool is required" >&2; exit 1; }
done
# Every kubectl below talks to this cluster, whatever the current context is.
kubectl() { command kubectl --context "kind-$name" "$@"; }
# Render first: a manifest kustomize refuses fails here, before minutes of cluster and image work.
command kubectl kustomize deploy/overlays/mock >/dev/null  # no cluster needed (none yet)

if ! kind get clusters | grep -qx "$name"; then
  kind_config | kind create cluster --name "$name" --image "$node_image" --config -
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
echo "cluster $name (Kubernetes $kube_version) is ready: hack/e2e-kind.sh runs the end-to-end scenario"
