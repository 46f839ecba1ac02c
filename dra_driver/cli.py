"""`gpushare-dra`: one command, a subcommand per role.

Flags and defaults are those promised in docs/contract.md; each subcommand's work
lives in its own module and is imported only when that subcommand runs, so `--help` is fast
and a node without NVML can still run the mock backend.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from typing import NoReturn

from . import flags
from .devicemodel import BINPACK, DEVICE_ORDERS

DEFAULT_DRIVER_NAME = "gpushare.dev"
SHARING_MODES = ("auto", "capacity", "partition")

DESCRIPTION = """\
gpushare-dra shares one NVIDIA GPU among many Kubernetes containers through Dynamic
Resource Allocation (DRA). ResourceSlices describe each GPU's memory and compute as
fractional capacity; the kubelet plugin prepares each allocated ResourceClaim into a CDI
spec that preloads libgpushare.so, which holds every container sharing the claim to one
memory and compute budget.

Start here:
  gpushare-dra demo               the whole path on simulated GPUs, no cluster needed
  gpushare-dra playground         a one-node cluster on simulated GPUs that kubectl drives
  gpushare-dra kubelet-plugin -h  the node daemon (DaemonSet) and its flags
"""


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        # Each default shown once: not when the help already says it, nor "None" for "unset".
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Every command-line error is one line: `gpushare-dra CMD: error: --flag: ...`, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message.removeprefix('argument ')}\n")


def _add_logging(p: argparse.ArgumentParser) -> None:
    from .log import FORMATS, LEVELS

    g = p.add_argument_group("logging")
    g.add_argument("--log-level", default="info", choices=LEVELS, help="least severe messages to print")
    g.add_argument("--log-format", default="auto", choices=FORMATS,
                   help="json: one JSON object per line (for log collectors); console: readable; "
                        "auto: json unless stderr is a terminal")


def _add_cluster(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                   help="this node's name; the ResourceSlice pool is named after it (env NODE_NAME, "
                        "set from the downward API in the DaemonSet)")
    g.add_argument("--kubeconfig", default=None, type=flags.existing_file,
                   help="kubeconfig file; unset, as kubectl: $KUBECONFIG, then ~/.kube/config if it exists, "
                        "then the in-cluster service account")
    g.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME,
                   help="DRA driver name: in ResourceSlices, DeviceClass selectors and socket names")


def _add_devices(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("GPUs and sharing")
    g.add_argument("--device-backend", default="nvml", choices=("nvml", "mock"),
                   help="nvml: the node's real GPUs; mock: simulated GPUs described by --mock-gpus")
    g.add_argument("--mock-gpus", default=None,
                   help="simulated GPUs for the mock backend (default 1x16Gi): COUNTxMEMORY groups (2x80Gi, "
                        "1x80Gi,2x40Gi) or a YAML file with a list 'gpus' of {memory, productName, healthy, ...}; "
                        "refused without --device-backend mock")
    g.add_argument("--driver-root", default=None,
                   help="where the NVIDIA driver's root filesystem is mounted (the DaemonSet: /driver-root, the "
                        "host's / or the GPU Operator's /run/nvidia/driver): NVML is loaded from its library "
                        "folders (usr/lib64, usr/lib/x86_64-linux-gnu, ...); unset: wherever the dynamic loader "
                        "finds libnvidia-ml.so.1 (a host, or the NVIDIA container toolkit); nvml backend only")
    g.add_argument("--sharing-mode", default="auto", choices=SHARING_MODES,
                   help="capacity: one device per GPU with consumable memory/compute capacity (needs the "
                        "DRAConsumableCapacity feature gate); partition: each GPU as --partitions equal "
                        "share devices (any resource.k8s.io/v1 cluster); auto: capacity when the API "
                        "server keeps the consumable-capacity fields, else partition")
    g.add_argument("--partitions", type=_positive_int, default=8,
                   help="share devices per GPU in partition mode (each gets memory/N and compute 100/N)")
    g.add_argument("--device-order", default=BINPACK, choices=DEVICE_ORDERS,
                   help="the order devices are published in, which the scheduler tries first-fit: binpack "
                        "fills one GPU before the next; spread puts each new claim on another GPU while "
                        "one has a free share (partition mode; capacity mode always packs: docs/controller.md)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= 128:
        raise argparse.ArgumentTypeError(f"{value} is out of range 1..128")
    return value


def version_text() -> str:
    """`gpushare-dra --version`: the package version and what it runs on."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    try:
        mine = version("gpushare-dra")
    except PackageNotFoundError:
        mine = "unknown (not installed; run from a source tree)"
    return (f"gpushare-dra {mine} (Python {platform.python_version()}, {platform.system().lower()} "
            f"{platform.machine()}; libgpushare.so built for glibc 2.17 and later, docs/images.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpushare-dra", description=DESCRIPTION, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=version_text(), help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("kubelet-plugin", formatter_class=_Formatter,
                       help="node daemon: registers with the kubelet, prepares claims, publishes slices",
                       description="Serve the kubelet's DRA gRPC API on this node: register at "
                                   "<registry-dir>/<driver-name>-reg.sock, serve <plugin-dir>/dra.sock, "
                                   "prepare each allocated ResourceClaim into a CDI spec under --cdi-root "
                                   "and keep this node's ResourceSlices current.")
    _add_cluster(p)
    g = p.add_argument_group("kubelet plugin")
    g.add_argument("--plugin-dir", default=None,
                   help="folder serving dra.sock (default /var/lib/kubelet/plugins/<driver-name>)")
    g.add_argument("--registry-dir", default="/var/lib/kubelet/plugins_registry",
                   help="kubelet plugin registration folder; serves <driver-name>-reg.sock")
    g.add_argument("--pod-uid", default="", type=flags.pod_uid,
                   help="this pod's UID (the DaemonSet passes metadata.uid): turns on rolling updates, "
                        "the old and the new pod of an upgrade serving at once (kubelet 1.33+). The sockets "
                        "get the UID in their names (<driver-name>-<uid>-reg.sock, dra-<uid>.sock), both "
                        "instances share --state-dir, take turns at calls and hand the node agent over "
                        "(docs/operations.md, Upgrade). Empty: dra.sock and <driver-name>-reg.sock")
    g.add_argument("--cdi-root", default="/var/run/cdi",
                   help="folder for CDI spec files read by the container runtime")
    g.add_argument("--state-dir", default="/var/lib/gpushare",
                   help="checkpoint, per-claim limit files and usage regions (must survive restarts)")
    g.add_argument("--hook-dir", default=None,
                   help="host folder holding libgpushare.so to mount into containers (default: the "
                        "library shipped in this package, see `gpushare-dra hook-path`)")
    g.add_argument("--mps-control", default="nvidia-cuda-mps-control", type=shlex.split,
                   help="command line of NVIDIA's MPS control program, run for claims with sharingStrategy MPS: "
                        "one control daemon per GPU (docs/strategies.md)")
    g.add_argument("--metrics-addr", default=":9400", type=flags.host_port,
                   help="HOST:PORT serving Prometheus metrics at /metrics; empty disables")
    g.add_argument("--healthcheck-port", type=flags.port, default=51515,
                   help="TCP port serving the gRPC health service (service name 'liveness') for the "
                        "kubelet's liveness probe; 0 disables")
    g.add_argument("--publish-slices", default=True, action=argparse.BooleanOptionalAction,
                   help="run the ResourceSlice controller for this node's pool inside this process")
    g.add_argument("--agent-interval", type=flags.positive_float, default=1.0,
                   help="seconds between the node agent's samples: NVML telemetry, compute-share rate "
                        "control (docs/agent.md)")
    g.add_argument("--backstop-interval", type=flags.positive_float, default=0.05,
                   help="seconds between the backstop's NVML per-process memory polls (docs/security.md)")
    g.add_argument("--enforce", default="kill", choices=("report", "kill"),
                   help="when NVML shows a claim's processes above its memory limit (memory allocated "
                        "around libgpushare.so): kill = SIGKILL the containers of its largest processes on "
                        "that GPU until the rest fits, with Warning Events on the claim and the pod and a "
                        "metric; report = only the Events and the metric")
    g = p.add_argument_group("GPU health")
    g.add_argument("--health-events", default=True, action=argparse.BooleanOptionalAction,
                   help="watch NVML XID and ECC events; a critical one taints the GPU's devices and is "
                        "reported to the kubelet (docs/operations.md, GPU health)")
    g.add_argument("--unhealthy-taint-effect", default="NoSchedule", choices=("NoSchedule", "NoExecute"),
                   help="effect of an unhealthy GPU's device taint: NoSchedule keeps new claims off it; "
                        "NoExecute also evicts the pods using it")
    g.add_argument("--health-recovery-seconds", type=flags.positive_float, default=300.0,
                   help="a GPU marked unhealthy by an event is healthy again after this long without a new "
                        "critical event, once NVML reaches it with no page retirement or row remapping pending")
    g.add_argument("--health-ignore-xids", metavar="LIST", type=flags.xid_list,
                   default="",
                   help="XIDs that never mark a GPU unhealthy, added to the built-in application XIDs "
                        "13,31,43,45,68,109: comma-separated numbers such as 63,92 for XIDs harmless on "
                        "your fleet, or 'all' to ignore every XID (double-bit ECC errors still count); "
                        "empty adds none (default empty)")
    _add_devices(p)
    _add_logging(p)
    p.set_defaults(run=_lazy("kubeletplugin.main", "run"))

    p = sub.add_parser("controller", formatter_class=_Formatter,
                       help="publish this node's ResourceSlices only (no kubelet plugin)",
                       description="Keep the ResourceSlices of (driver, pool=node name) equal to the "
                                   "discovered GPUs. The kubelet plugin runs this by default; run it "
                                   "alone where slices are published from elsewhere.")
    _add_cluster(p)
    _add_devices(p)
    _add_logging(p)
    p.set_defaults(run=_lazy("dra_driver.controller", "run"))

    p = sub.add_parser("cleanup", formatter_class=_Formatter,
                       help="delete this driver's ResourceSlices, and with --node-state its node files (uninstall)",
                       description="Delete the ResourceSlices of --driver-name, for --node-name's pool "
                                   "or, with --all-nodes, every pool. The plugin leaves slices in place "
                                   "on shutdown so a restart never makes pods unschedulable. With "
                                   "--node-state, also remove the files the plugin keeps on this node "
                                   "(docs/operations.md, Uninstall).")
    _add_cluster(p)
    p.add_argument("--all-nodes", action="store_true", help="delete the slices of every node's pool")
    g = p.add_argument_group("node files (run on the node, after the DaemonSet is gone)")
    g.add_argument("--node-state", action="store_true",
                   help="also remove this node's files: our CDI specs in --cdi-root, the checkpoint and claim "
                        "files in --state-dir and, with --hook-dir, the installed libraries")
    g.add_argument("--keep-slices", action="store_true",
                   help="do not touch the API server (with --node-state: only the node's files)")
    g.add_argument("--state-dir", default="/var/lib/gpushare", help="the plugin's --state-dir")
    g.add_argument("--cdi-root", default="/var/run/cdi", help="the plugin's --cdi-root")
    g.add_argument("--hook-dir", default=None,
                   help="the folder install-hook wrote (the DaemonSet: /opt/gpushare/lib); unset: left alone")
    g.add_argument("--force", action="store_true",
                   help="remove node files even while claims are still prepared on this node")
    _add_logging(p)
    p.set_defaults(run=_lazy("dra_driver.controller", "run_cleanup"))

    p = sub.add_parser("discover", formatter_class=_Formatter,
                       help="print the GPUs this node would publish, as YAML",
                       description="Discover GPUs with --device-backend and print them as YAML: 'gpus' "
                                   "(a file --mock-gpus accepts), 'sharing' and, per sharing mode, the "
                                   "'devices' the ResourceSlices would hold (auto: both modes).")
    _add_devices(p)
    _add_logging(p)
    p.set_defaults(run=_run_discover)

    p = sub.add_parser("top", formatter_class=_Formatter,
                       help="a node's claims in the terminal: limits, memory, utilization, paced time",
                       description="Read a kubelet plugin's metrics endpoint and show each claim's memory "
                                   "limit and use, compute share and measured utilization, and paced time, "
                                   "refreshing every --interval seconds.")
    p.add_argument("--url", default="http://127.0.0.1:9400/metrics", type=flags.metrics_url,
                   help="the plugin's metrics endpoint: a URL, or HOST:PORT (http:// and /metrics added)")
    p.add_argument("--interval", type=flags.positive_float, default=2.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(run=_lazy("dra_driver.top", "run"))

    p = sub.add_parser("hook-path", formatter_class=_Formatter,
                       help="print where libgpushare.so, the simulated driver and the probe are",
                       description="Print the paths of the native files shipped with this package.")
    p.add_argument("what", nargs="?", default=None,
                   choices=("library", "sim_dir", "sim_cuda", "sim_nvml", "probe"),
                   help="print only this path")
    p.set_defaults(run=_run_hook_path)

    p = sub.add_parser("install-hook", formatter_class=_Formatter,
                       help="install libgpushare.so on the host (the DaemonSet's init container)",
                       description="Copy the shipped libgpushare.so into --dest as libgpushare-<hash>.so "
                                   "and point the symlink libgpushare.so at it. An installed file is "
                                   "never overwritten, because running containers map it.")
    p.add_argument("--dest", default="/opt/gpushare/lib", help="host folder (the plugin's --hook-dir)")
    p.add_argument("--with-sim", action="store_true",
                   help="also install the simulated CUDA driver and NVML into <dest>/sim (mock-GPU clusters)")
    _add_logging(p)
    p.set_defaults(run=_lazy("dra_driver.install", "run"))

    p = sub.add_parser("share-agent", formatter_class=_Formatter,
                       help="the node agent's compute slots for claims laid out with GPUSHARE_RUN_DIR "
                            "(benchmarks, GPU validation)",
                       description="Lay out the time slots of the claims in the given run dirs (each with limits, "
                                   "region/<i> and control/<i>, as GPUSHARE_RUN_DIR) and write them into their "
                                   "control files every --interval, as the kubelet plugin's agent does "
                                   "(docs/compute.md).")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a claim's run dir")
    p.add_argument("--interval", type=float, default=0.25, help="seconds between periods")
    _add_logging(p)
    p.set_defaults(run=_lazy("dra_driver.agent.standalone", "run"))

    # The playground (demo, API emulator): stand-ins for a cluster, kept out of the product.
    from .playground.commands import add_commands

    add_commands(sub, _Formatter, _add_logging)
    for sub_parser in sub.choices.values():
        _env_defaults(sub_parser)
    return parser


# Flags whose environment variable is not GPUSHARE_<FLAG> (names users already know).
_ENV_OF = {"--kubeconfig": "KUBECONFIG", "--node-name": "NODE_NAME"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def env_name(flag: str) -> str:
    """--health-ignore-xids -> GPUSHARE_HEALTH_IGNORE_XIDS"""
    return _ENV_OF.get(flag) or "GPUSHARE_" + flag.lstrip("-").replace("-", "_").upper()


def _env_defaults(parser: argparse.ArgumentParser) -> None:
    """Every flag of a command can be set by its environment variable (a DaemonSet's env or a
    ConfigMap): the variable replaces the default, the flag still wins, and a bad value is the
    same one-line error as the flag's. --help names each variable."""
    for action in parser._actions:
        flag = next((o for o in action.option_strings if o.startswith("--")), None)
        if flag is None or action.dest in ("help", "version"):
            continue
        name = env_name(flag)
        if action.help and name not in action.help:
            action.help += f" (env {name})"
        value = os.environ.get(name)
        if value is None or flag in _ENV_OF:  # those two are read where they are used
            continue
        if action.nargs == 0:  # on/off flags
            if value.strip().lower() not in _TRUE + _FALSE:
                action.default, action.type = value, _refuse(name, value, "is not true or false")
            else:
                action.default = value.strip().lower() in _TRUE
        elif action.choices is not None and value not in action.choices:
            action.default, action.type = value, _refuse(name, value, f"is not one of {', '.join(action.choices)}")
        else:
            action.default = value  # a string default: argparse converts it with the flag's type


def _refuse(name: str, value: str, problem: str) -> Callable[[str], object]:
    def refuse(_: str) -> object:
        raise argparse.ArgumentTypeError(f"{value!r} from ${name} {problem}")
    return refuse


def _lazy(module: str, func: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import importlib

        command: Callable[[argparse.Namespace], int] = importlib.import_module(module).__dict__[func]
        return command(args)

    return run


def _run_discover(args: argparse.Namespace) -> int:
    """The GPUs as a mock GPU file (--mock-gpus FILE reads it back) plus the devices each
    sharing mode publishes for them; `auto` shows both modes, since the server decides."""
    import yaml

    from .controller.slices import desired_devices
    from .discovery import make_backend, mock_entry

    gpus = make_backend(args.device_backend, args.mock_gpus, args.driver_root).discover()
    modes = ("capacity", "partition") if args.sharing_mode == "auto" else (args.sharing_mode,)
    devices = {mode: [{"name": d["name"], **{k: c["value"] for k, c in d["capacity"].items()},
                       **({"taints": [t["value"] for t in d["taints"]]} if "taints" in d else {})}
                      for d in desired_devices(gpus, mode, args.partitions, taints=True, order=args.device_order)]
               for mode in modes}
    doc = {"gpus": [mock_entry(g) for g in gpus],
           "sharing": {"mode": args.sharing_mode, "partitions": args.partitions},
           "devices": devices}
    print(yaml.safe_dump(doc, sort_keys=False), end="")
    return 0


def _run_hook_path(args: argparse.Namespace) -> int:
    from .hookpath import native_paths

    paths = native_paths()
    if args.what:
        print(paths[args.what])
    else:
        for key, value in paths.items():
            print(f"{key}: {value}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .log import configure

    args, unknown = build_parser().parse_known_args(argv)

    def usage_error(message: str) -> int:
        # A human line even when stderr is not a terminal: logs may be JSON, CLI errors never are.
        print(f"gpushare-dra {args.command}: error: {message}", file=sys.stderr)
        return 2

    if unknown:  # named with the subcommand, whose --help lists what it accepts
        return usage_error(f"unrecognized arguments: {' '.join(unknown)} (see gpushare-dra {args.command} --help)")

    if hasattr(args, "log_level"):
        configure(args.log_level, args.log_format)
    try:
        return int(args.run(args) or 0)
    except flags.StartupError as e:
        return usage_error(str(e))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
