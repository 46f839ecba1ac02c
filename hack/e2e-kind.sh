#!/usr/bin/env bash
# The end-to-end scenario on a kind cluster made by hack/kind-up.sh (mock GPUs, simulated
# driver). The same story as tests/e2e and `gpushare-dra demo`, with kubectl:
#   two pods of two containers share claim shared-gpu (4Gi, 30 %): together they hold
#   exactly 4Gi and the allocations past it fail with out-of-memory; each container sees 4Gi
#   total; claim other-team on the same GPU gets its own 2Gi; the plugin restarts between
#   the two pods' starts without losing the shared budget; after the pods and claims are
#   deleted, no CDI spec or claim file is left on the node.
# Works on every release hack/kind-up.sh makes (1.34 to 1.37; the scenario needs consumable
# capacity, on by default from 1.36 and gated on 1.34/1.35 by kind-up). Not run in CI (no Docker there).
#
#   hack/e2e-kind.sh [CLUSTER_NAME]     (default gpushare, the cluster kind-up made)
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:-gpushare}"
# Every kubectl below talks to that cluster, whatever the current context is.
kubectl() { command kubectl --context "kind-$name" "$@"; }
examples=deploy/examples/e2e
fail() { echo "e2e-kind: FAIL: $*" >&2; exit 1; }
ok() { echo "e2e-kind: ok: $*"; }

allocated() {  # bytes a container holds, from the probe's "allocated=N ... result=R" line
  kubectl logs "$1" -c "$2" | sed -n 's/^allocated=\([0-9]*\) .*/\1/p'
}

echo "e2e-kind: cluster $name, Kubernetes $(kubectl version -o json | sed -n 's/.*"gitVersion": *"\(v[^"]*\)".*/\1/p' | tail -1)"
kubectl delete -f "$examples" --ignore-not-found --wait=true >/dev/null
kubectl apply -f "$examples/01-claims.yaml" -f "$examples/02-trainer-a.yaml"
kubectl wait --for=condition=Ready pod/trainer-a --timeout=180s

# The plugin restarts between the two pods: the claim stays prepared, its budget shared.
kubectl -n gpushare-system rollout restart daemonset/gpushare-kubelet-plugin
kubectl -n gpushare-system rollout status daemonset/gpushare-kubelet-plugin --timeout=180s
kubectl apply -f "$examples/03-trainer-b.yaml" -f "$examples/04-other-team.yaml"
kubectl wait --for=condition=Ready pod/trainer-b pod/other --timeout=180s
sleep 5  # the probes print their result as soon as they have allocated

total=0
for pc in trainer-a/a1 trainer-a/a2 trainer-b/b1 trainer-b/b2; do
  got=$(allocated "${pc%/*}" "${pc#*/}")
  [ -n "$got" ] || fail "$pc printed no result"
  echo "  $pc holds $got bytes"
  total=$((total + got))
done
[ "$total" -eq $((4 << 30)) ] || fail "shared-gpu's containers hold $total bytes, not the 4Gi budget"
ok "the four containers of shared-gpu hold exactly 4Gi together"
kubectl logs trainer-a --all-containers | grep -q 'result=oom' \
  || kubectl logs trainer-b --all-containers | grep -q 'result=oom' \
  || fail "no container of shared-gpu saw out-of-memory"
ok "the allocations past the budget failed with out-of-memory"
[ "$(kubectl get pod trainer-a trainer-b -o jsonpath='{.items[*].status.phase}')" = "Running Running" ] \
  || fail "a container of shared-gpu stopped"
ok "every container keeps running"

# shellcheck disable=SC2016  # $(...) expands in the container, not here
meminfo=$(kubectl exec trainer-b -c b1 -- sh -c '"$(gpushare-dra hook-path probe)" meminfo')
echo "$meminfo" | grep -q "cu_total=$((4 << 30))" || fail "cuMemGetInfo inside does not show 4Gi: $meminfo"
echo "$meminfo" | grep -q "nvml_total=$((4 << 30))" || fail "NVML inside does not show 4Gi: $meminfo"
ok "memory queries inside show the claim's 4Gi"

[ "$(allocated other c1)" -eq $((2 << 30)) ] || fail "other-team did not get its own 2Gi"
ok "claim other-team on the same GPU has its own 2Gi budget"

node=$(kubectl get pod trainer-a -o jsonpath='{.spec.nodeName}')
kubectl delete -f "$examples" --wait=true
sleep 5  # the kubelet unprepares after the pods are gone
leftover=$(docker exec "$node" sh -c 'ls /var/run/cdi/k8s.gpushare.dev-claim_* /var/lib/gpushare/claims/ 2>/dev/null' || true)
[ -z "$leftover" ] || fail "left on $node after unprepare: $leftover"
ok "no CDI spec and no claim state left on $node"
echo "e2e-kind: every step behaved"
