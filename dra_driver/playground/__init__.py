"""The playground: stand-ins for a cluster, so the driver runs end to end on one machine.

- emulator/: an in-memory Kubernetes API server (the real kubectl can talk to it);
- allocator/: the kube-scheduler's DRA allocation, for claims in the emulator;
- kubelet.py: the kubelet's side of the DRA gRPC API (registration, Prepare, Unprepare);
- claims.py: ResourceClaims allocated as kube-scheduler leaves them (for tests and benchmarks);
- containers.py: runs a CDI spec's containers, with podman or as host processes;
- demo.py: `gpushare-dra demo`, the whole path told step by step.

The product (dra_driver's other packages, kubeletplugin, cdi) never imports this package;
the import-linter contract in pyproject.toml fails `make test` if it does. The one seam is
commands.py, which declares the `demo` and `emulator` subcommands for the CLI.
"""
