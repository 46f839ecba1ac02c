# Shared by hack/cluster-up and hack/cluster-down: where the one-node cluster keeps its state,
# and the host paths it may create (each is removed by cluster-down only if cluster-up made it).
# Sourced, not run.

# Every path cluster-up records and cluster-down compares goes through norm: absolute, symlinks
# resolved, no `//` or trailing `/` (a path recorded as /sys/fs/cgroup/cpu//kubepods never
# matched the one found later, and a .cache reached through a symlink never matched /proc/*/exe).
norm() { realpath -m -- "$1"; }
repo=$(norm "$(dirname "${BASH_SOURCE[0]}")/../..")
cache=$(norm "${CLUSTER_CACHE:-$repo/.cache/cluster}")
state=$(norm "${CLUSTER_STATE:-/var/lib/gpushare-cluster}")
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
network=gpushare  # the CNI network's name (its results: /var/lib/cni/results/gpushare-<sandbox>-eth0)

# Host paths the kubelet, the plugin and containerd (/var/lib/cni: its CNI result cache) use.
# cluster-up notes which were absent (state/created-paths); cluster-down removes only those (the
# CDI folders only when empty: other software writes specs there too).
host_paths=(/var/lib/kubelet /var/lib/gpushare /opt/gpushare /var/lib/cni /etc/cdi /var/run/cdi
            /var/log/pods /var/log/containers)
cdi_dirs=(/etc/cdi /var/run/cdi)
# The product's CDI specs on this node (docs/contract.md): the plugin's kind, mounting its state dir.
# cluster-down removes those written since cluster-up (state/up-since), no other file there.
plugin_state=/var/lib/gpushare
cdi_kind=k8s.gpushare.dev/claim
cluster_spec() {  # cluster_spec FILE: true when FILE is a CDI spec this cluster's plugin wrote
    [ -f "$1" ] && [ "$1" -nt "$state/up-since" ] &&
        grep -Eq "^[[:space:]]*\"?kind\"?:[[:space:]]*\"?${cdi_kind//./\\.}\"?,?[[:space:]]*$" "$1" &&
        grep -qF "$plugin_state/" "$1"
}
# The kubelet's cgroup root (its cgroupRoot): the pods' cgroups are <hierarchy>/gpushare-cluster/kubepods/...,
# never the host's /kubepods, which another kubelet, podman or a test may use. cluster-down stops
# the processes in these folders alone and removes them.
cgroup_root=/gpushare-cluster
cgroup_roots() {  # the cgroup root in each hierarchy mounted under /sys/fs/cgroup (v1, hybrid or v2)
    awk '($3 == "cgroup" || $3 == "cgroup2") && $2 ~ "^/sys/fs/cgroup" {print $2}' /proc/self/mounts |
        while read -r m; do norm "$m$cgroup_root"; done | sort -u
}
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

# The second node (hack/cluster-up --nodes 2) on the same machine: its kubelet and containerd run
# in a mount namespace of their own (kept by a bind mount of its file, node2_mntns), where each
# host path the kubelet, the plugin DaemonSet and containerd use (node2_paths) is bound to the
# node's folder <state>/node2/root<path>; so the DaemonSet's hostPath /var/lib/kubelet/plugins_registry
# is node 2's kubelet's, its /var/run/cdi node 2's containerd's. Own ports, pod subnet, bridge and
# cgroup root (under the first node's, so that cluster-down's sweep of cgroup_root covers it).
node2_suffix=-2  # the node's name: the first node's with this suffix
node2_state=$state/node2
node2_run=$run_dir/node2
node2_sock=$node2_run/containerd.sock
node2_mntns=$node2_run/mnt
node2_pod_cidr=10.89.0.0/16
node2_bridge=gpushare1
node2_network=gpushare2
node2_cgroup_root=$cgroup_root/node2
node2_kubelet_port=10350
node2_healthz_port=10348
node2_paths=("${host_paths[@]}")
node2_components=(containerd-2 kubelet-2)
in_node2() { nsenter --mount="$node2_mntns" "$@"; }  # a command in the second node's mount namespace
node2_namespace_kept() { awk -v m="$node2_mntns" '$2 == m {found=1} END {exit !found}' /proc/self/mounts; }
