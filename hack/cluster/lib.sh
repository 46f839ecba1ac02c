# Shared by hack/cluster-up and hack/cluster-down: where the one-node cluster keeps its state,
# and the host paths it may create (each is removed by cluster-down only if cluster-up made it).
# Sourced, not run.

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${CLUSTER_CACHE:-$repo/.cache/cluster}
state=${CLUSTER_STATE:-/var/lib/gpushare-cluster}
run_dir=/run/gpushare-cluster
pki=$state/pki
logs=$state/logs
pids=$state/pids
sock=$run_dir/containerd.sock
admin_kubeconfig=$state/admin.kubeconfig

# Networking without kube-proxy or iptables: pods reach the API server at the `kubernetes`
# Service's ClusterIP because that address is put on the host's lo and the API server listens
# on 443 there; the rest of the Service range is unreachable (never routed off the machine).
service_cidr=10.96.0.0/24
service_ip=10.96.0.1
pod_cidr=10.88.0.0/16
bridge=gpushare0

# Host paths the kubelet, the plugin and containerd use. cluster-up notes which were absent
# (state/created-paths); cluster-down removes only those, plus CDI specs that were not there.
host_paths=(/var/lib/kubelet /var/lib/gpushare /opt/gpushare /etc/cdi /var/run/cdi)
# Sysctls the kubelet (its kernel tunables) and the bridge CNI (ip_forward) set: cluster-down
# puts back what cluster-up found.
sysctls=(net/ipv4/ip_forward vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
         kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
# The components, in start order; cluster-down stops them in reverse.
components=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet)

die() { echo "$*" >&2; exit 1; }

pid_of() {  # the pid cluster-up recorded for a component, if that process still runs
    local f=$pids/$1.pid
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
}
