"""The node program's subcommands of `gpushare-dra`: `kubelet-plugin`, `cleanup` and `share-agent`.

Declared in the entry-point group dra_driver.cli.COMMANDS_GROUP (pyproject.toml), so the CLI
finds them without importing this package. Each command's code is imported when it runs.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from dra_driver import flags
from dra_driver.cli import Formatter, add_cluster, add_devices, add_logging, lazy
from dra_driver.config.strategies import GpuStrategies
from dra_driver.mig import GpuSet

from .config import DEFAULTS


def add_commands(sub: Any) -> None:
    p = sub.add_parser("kubelet-plugin", formatter_class=Formatter,
                       help="node daemon: registers with the kubelet, prepares claims, publishes slices",
                       description="Serve the kubelet's DRA gRPC API on this node: register at "
                                   "<registry-dir>/<driver-name>-reg.sock, serve <plugin-dir>/dra.sock, "
                                   "prepare each allocated ResourceClaim into a CDI spec under --cdi-root "
                                   "and keep this node's ResourceSlices current.")
    add_cluster(p)
    g = p.add_argument_group("kubelet plugin")
    g.add_argument("--plugin-dir", default=None,
                   help="folder serving dra.sock (default /var/lib/kubelet/plugins/<driver-name>)")
    g.add_argument("--registry-dir", default=DEFAULTS.registry_dir,
                   help="kubelet plugin registration folder; serves <driver-name>-reg.sock")
    g.add_argument("--pod-uid", default=DEFAULTS.pod_uid, type=flags.pod_uid,
                   help="this pod's UID (the DaemonSet passes metadata.uid): turns on rolling updates, "
                        "the old and the new pod of an upgrade serving at once (kubelet 1.33+). The sockets "
                        "get the UID in their names (<driver-name>-<uid>-reg.sock, dra-<uid>.sock), both "
                        "instances share --state-dir, take turns at calls and hand the node agent over "
                        "(docs/operations.md, Upgrade). Empty: dra.sock and <driver-name>-reg.sock")
    g.add_argument("--handover-timeout", type=flags.non_negative_float, default=DEFAULTS.handover_timeout,
                   metavar="SECONDS",
                   help="with --pod-uid: on SIGTERM (the pod deleted, evicted or replaced) keep serving until "
                        "the kubelet has registered another plugin pod of this node, at most this long, so a pod "
                        "created meanwhile is prepared at once instead of after the kubelet's next resync "
                        "(60 to 90 s); keep it below the pod's terminationGracePeriodSeconds less 10 s; "
                        "0 stops at once (docs/operations.md, Plugin pod replaced)")
    g.add_argument("--cdi-root", default=DEFAULTS.cdi_root,
                   help="folder for CDI spec files read by the container runtime")
    g.add_argument("--state-dir", default=DEFAULTS.state_dir,
                   help="checkpoint, per-claim limit files and usage regions (must survive restarts)")
    g.add_argument("--hook-dir", default=None,
                   help="host folder holding libgpushare.so to mount into containers (default: the "
                        "library shipped in this package, see `gpushare-dra hook-path`)")
    g.add_argument("--mps-control", default=" ".join(DEFAULTS.mps_control), type=shlex.split,
                   help="command line of NVIDIA's MPS control program, run for claims with sharingStrategy MPS: "
                        "one control daemon per GPU (docs/strategies.md); left at its default with --driver-root "
                        "set, the driver root's own program, run chrooted there")
    g.add_argument("--mps-gpus", default=DEFAULTS.mps_gpus, type=flags.gpu_list(GpuStrategies.parse),
                   help="GPUs that serve sharingStrategy MPS claims only: none, all, or GPU indexes (0,2); "
                        "the others serve TimeSlicing and None claims. Published as the devices' attribute "
                        "sharingStrategy (MPS or TimeSlicing), which the DeviceClasses mps.gpushare.dev and "
                        "gpushare.dev select on (docs/strategies.md, Keeping strategies apart)")
    g.add_argument("--mixed-strategies", default=DEFAULTS.mixed_strategies, action=argparse.BooleanOptionalAction,
                   help="every GPU serves every strategy (sharingStrategy Mixed): MPS claims may share a GPU "
                        "with TimeSlicing and None claims, where the MPS server is one context in the GPU's "
                        "time slicing and its claims get less than their share (docs/strategies.md)")
    g.add_argument("--mig-gpus", default=DEFAULTS.mig_gpus, type=flags.gpu_list(GpuSet.parse),
                   help="GPUs offered as MIG devices: none, all, or GPU indexes (0,2). A GPU named here whose "
                        "MIG mode the operator enabled (nvidia-smi -i N -mig 1, then a GPU reset) is published as "
                        "its MIG profile placements (DeviceClass mig.gpushare.dev); its instances are created when a "
                        "claim is prepared and destroyed when it is unprepared. A GPU named here with MIG mode off is "
                        "published as before, and the log says why; a GPU in MIG mode not named here is not offered. "
                        "The plugin never switches MIG mode (docs/mig.md)")
    g.add_argument("--metrics-addr", default=DEFAULTS.metrics_addr, type=flags.host_port,
                   help="HOST:PORT serving Prometheus metrics at /metrics; empty disables")
    g.add_argument("--healthcheck-port", type=flags.port, default=DEFAULTS.healthcheck_port,
                   help="TCP port serving the gRPC health service (service name 'liveness') for the "
                        "kubelet's liveness probe; 0 disables")
    g.add_argument("--publish-slices", default=DEFAULTS.publish_slices, action=argparse.BooleanOptionalAction,
                   help="run the ResourceSlice controller for this node's pool inside this process")
    g.add_argument("--agent-interval", type=flags.positive_float, default=DEFAULTS.agent_interval,
                   help="seconds between the node agent's samples: NVML telemetry, compute-share rate "
                        "control (docs/agent.md)")
    g.add_argument("--backstop-interval", type=flags.positive_float, default=DEFAULTS.backstop_interval,
                   help="seconds between the backstop's NVML per-process memory polls (docs/security.md)")
    g.add_argument("--enforce", default=DEFAULTS.enforce, choices=("report", "kill"),
                   help="when NVML shows a claim's processes above its memory limit (memory allocated "
                        "around libgpushare.so): kill = SIGKILL the containers of its largest processes on "
                        "that GPU until the rest fits, with Warning Events on the claim and the pod and a "
                        "metric; report = only the Events and the metric. The compute guard likewise: a "
                        "claim far over its compute share while a neighbour is short is killed when the "
                        "neighbour's loss is established, else held back and killed if that is not enough "
                        "(kill), or only reported (report)")
    g = p.add_argument_group("GPU health")
    g.add_argument("--health-events", default=DEFAULTS.health_events, action=argparse.BooleanOptionalAction,
                   help="watch NVML XID and ECC events; a critical one taints the GPU's devices and is "
                        "reported to the kubelet (docs/operations.md, GPU health)")
    g.add_argument("--unhealthy-taint-effect", default=DEFAULTS.unhealthy_taint_effect,
                   choices=("NoSchedule", "NoExecute"),
                   help="effect of an unhealthy GPU's device taint: NoSchedule keeps new claims off it; "
                        "NoExecute also evicts the pods using it")
    g.add_argument("--health-recovery-seconds", type=flags.positive_float, default=DEFAULTS.health_recovery_seconds,
                   help="a GPU marked unhealthy by an event is healthy again after this long without a new "
                        "critical event, once NVML reaches it with no page retirement or row remapping pending")
    g.add_argument("--health-ignore-xids", metavar="LIST", type=flags.xid_list,
                   default="",
                   help="XIDs that never mark a GPU unhealthy, added to the built-in application XIDs "
                        "13,31,43,45,68,109: comma-separated numbers such as 63,92 for XIDs harmless on "
                        "your fleet, or 'all' to ignore every XID (double-bit ECC errors still count); "
                        "empty adds none (default empty)")
    add_devices(p)
    add_logging(p)
    p.set_defaults(run=lazy("kubeletplugin.main", "run"))


    p = sub.add_parser("cleanup", formatter_class=Formatter,
                       help="delete this driver's ResourceSlices, and with --node-state its node files (uninstall)",
                       description="Delete the ResourceSlices of --driver-name, for --node-name's pool "
                                   "or, with --all-nodes, every pool. The plugin leaves slices in place "
                                   "on shutdown so a restart never makes pods unschedulable. With "
                                   "--node-state, also remove the files the plugin keeps on this node "
                                   "(docs/operations.md, Uninstall).")
    add_cluster(p)
    p.add_argument("--all-nodes", action="store_true", help="delete the slices of every node's pool")
    g = p.add_argument_group("node files (run on the node, after the DaemonSet is gone)")
    g.add_argument("--node-state", action="store_true",
                   help="also remove this node's files: our CDI specs in --cdi-root, the checkpoint and claim "
                        "files in --state-dir and, with --hook-dir, the installed libraries")
    g.add_argument("--keep-slices", action="store_true",
                   help="do not touch the API server (with --node-state: only the node's files)")
    g.add_argument("--state-dir", default=DEFAULTS.state_dir, help="the plugin's --state-dir")
    g.add_argument("--cdi-root", default=DEFAULTS.cdi_root, help="the plugin's --cdi-root")
    g.add_argument("--hook-dir", default=None,
                   help="the folder install-hook wrote (the DaemonSet: /opt/gpushare/lib); unset: left alone")
    g.add_argument("--force", action="store_true",
                   help="remove node files even while claims are still prepared on this node")
    add_logging(p)
    p.set_defaults(run=lazy("kubeletplugin.uninstall", "run_cleanup"))


    p = sub.add_parser("share-agent", formatter_class=Formatter,
                       help="the node agent's compute slots for claims laid out with GPUSHARE_RUN_DIR "
                            "(benchmarks, GPU validation)",
                       description="Lay out the time slots of the claims in the given run dirs (each with limits, "
                                   "region/<i> and control/<i>, as GPUSHARE_RUN_DIR) and write them into their "
                                   "control files every --interval, as the kubelet plugin's agent does "
                                   "(docs/compute.md), with each claim's processes on the GPU: those NVML "
                                   "lists that map the claim's region (docs/agent.md).")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a claim's run dir")
    p.add_argument("--interval", type=float, default=0.25, help="seconds between periods")
    add_logging(p)
    p.set_defaults(run=lazy("kubeletplugin.agent.standalone", "run"))
