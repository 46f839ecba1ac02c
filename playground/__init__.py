"""The playground: stand-ins for a cluster, so the driver runs end to end on one machine.

- emulator/: an in-memory Kubernetes API server (the real kubectl can talk to it);
- allocator/: the kube-scheduler's DRA allocation, for claims in the emulator;
- kubelet.py: the kubelet's side of the DRA gRPC API (registration, Prepare, Unprepare);
- claims.py: ResourceClaims allocated as kube-scheduler leaves them (for tests and benchmarks);
- containers.py: runs a CDI spec's containers, with podman or as host processes;
- node.py: one simulated GPU node (the kubelet plugin on mock GPUs, the kubelet's sockets, a runner);
- demo.py: `gpushare-dra demo`, the whole path told step by step;
- cluster.py: `gpushare-dra playground`, the emulator with a cluster behind it: the
  resourceclaim controller (claimcontroller.py), the scheduler (scheduler.py) and the kubelet's
  pods (podsync.py) on one node; objects.py holds what they share.

The product (dra_driver's other packages, kubeletplugin, cdi) never imports this package;
the import-linter contract in pyproject.toml fails `make test` if it does. The one seam is
commands.py, which declares the `demo`, `playground` and `emulator` subcommands for the CLI.
"""
