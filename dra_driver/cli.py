"""`gpushare-dra`: one command, a subcommand per role.

Flags and defaults are those promised in docs/contract.md; each subcommand's work
lives in its own module and is imported only when that subcommand runs, so `--help` is fast
and a node without NVML can still run the mock backend.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import NoReturn

from . import flags
from .devicemodel import BINPACK, DEVICE_ORDERS
from .mig import GpuSet

DEFAULT_DRIVER_NAME = "gpushare.dev"
COMMANDS_GROUP = "gpushare_dra.commands"  # each entry: a function adding subcommands to the CLI's subparsers
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


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        # Each default shown once: not when the help already says it, nor "None" for "unset".
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Every command-line error is one line: `gpushare-dra CMD: error: --flag: ...`, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message.removeprefix('argument ')}\n")


def add_logging(p: argparse.ArgumentParser) -> None:
    from .log import FORMATS, LEVELS

    g = p.add_argument_group("logging")
    g.add_argument("--log-level", default="info", choices=LEVELS, help="least severe messages to print")
    g.add_argument("--log-format", default="auto", choices=FORMATS,
                   help="json: one JSON object per line (for log collectors); console: readable; "
                        "auto: json unless stderr is a terminal")


def add_kubeconfig(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--kubeconfig", default=None, type=flags.existing_file,
                   help="kubeconfig file; unset, as kubectl: $KUBECONFIG, then ~/.kube/config if it exists, "
                        "then the in-cluster service account")


def add_cluster(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                   help="this node's name; the ResourceSlice pool is named after it (env NODE_NAME, "
                        "set from the downward API in the DaemonSet)")
    add_kubeconfig(g)
    g.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME,
                   help="DRA driver name: in ResourceSlices, DeviceClass selectors and socket names")


def add_devices(p: argparse.ArgumentParser) -> None:
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

    from dra_driver import __version__

    return (f"gpushare-dra {__version__} (Python {platform.python_version()}, {platform.system().lower()} "
            f"{platform.machine()}; libgpushare.so built for glibc 2.17 and later, docs/images.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpushare-dra", description=DESCRIPTION, formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=version_text(), help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("controller", formatter_class=Formatter,
                       help="publish this node's ResourceSlices only (no kubelet plugin)",
                       description="Keep the ResourceSlices of (driver, pool=node name) equal to the "
                                   "discovered GPUs. The kubelet plugin runs this by default; run it "
                                   "alone where slices are published from elsewhere.")
    add_cluster(p)
    add_devices(p)
    add_logging(p)
    p.set_defaults(run=lazy("dra_driver.controller", "run"))

    p = sub.add_parser("discover", formatter_class=Formatter,
                       help="print the GPUs this node would publish, as YAML",
                       description="Discover GPUs with --device-backend and print them as YAML: 'gpus' "
                                   "(a file --mock-gpus accepts), 'sharing' and, per sharing mode, the "
                                   "'devices' the ResourceSlices would hold (auto: both modes); with "
                                   "--mig-gpus, 'mig': what each GPU it names offers and why. Reads only: "
                                   "no GPU's MIG mode or instances are changed.")
    add_devices(p)
    p.add_argument("--mig-gpus", default="none", type=flags.gpu_list(GpuSet.parse),
                   help="the kubelet plugin's --mig-gpus (none, all, or GPU indexes such as 0,2): the devices as a "
                        "plugin with it would publish them, and 'mig.notes' with what its log says of each GPU "
                        "it names, e.g. why one offers no MIG devices (MIG mode disabled; docs/mig.md)")
    add_logging(p)
    p.set_defaults(run=_run_discover)

    p = sub.add_parser("top", formatter_class=Formatter,
                       help="a node's claims in the terminal: limits, memory, utilization, paced time",
                       description="Read a kubelet plugin's metrics endpoint and show each claim's memory "
                                   "limit and use, compute share and measured utilization, and paced time, "
                                   "refreshing every --interval seconds.")
    p.add_argument("--url", default="http://127.0.0.1:9400/metrics", type=flags.metrics_url,
                   help="the plugin's metrics endpoint: a URL, or HOST:PORT (http:// and /metrics added)")
    p.add_argument("--interval", type=flags.positive_float, default=2.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(run=lazy("dra_driver.top", "run"))

    p = sub.add_parser("explain", formatter_class=Formatter,
                       help="why a ResourceClaim is not allocated: each GPU's free memory and compute, and "
                            "whether each request fits it",
                       description="Read the driver's ResourceSlices and every allocated ResourceClaim and print, "
                                   "for CLAIM, what each request asks and, for every GPU of the cluster, what it "
                                   "has free now and whether the request fits (memory rounded up to the 256Mi "
                                   "step and compute to a whole percent, as the scheduler does).")
    p.add_argument("claim", metavar="CLAIM", help="the ResourceClaim's name")
    p.add_argument("-n", "--namespace", default="default", help="the claim's namespace")
    g = p.add_argument_group("cluster")
    add_kubeconfig(g)
    g.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name of the slices")
    p.set_defaults(run=lazy("dra_driver.explain", "run"))

    p = sub.add_parser("uninstall-check", formatter_class=Formatter,
                       help="before an uninstall: exit 1 naming the claims still in use (the Helm chart's "
                            "pre-delete hook); --force deletes their pods and waits until they are unprepared",
                       description="List the ResourceClaims with a device of --driver-name that pods use or a "
                                   "plugin has prepared. None: exit 0. Some: print each (namespace/name, node, "
                                   "pods) and exit 1, because once the plugins are gone the kubelet cannot "
                                   "unprepare them and their pods hang in Terminating. --force deletes those "
                                   "pods and waits (--timeout) until the plugins have unprepared every claim.")
    g = p.add_argument_group("cluster")
    add_kubeconfig(g)
    g.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name of the claims' devices")
    p.add_argument("--force", action="store_true",
                   help="delete the pods that use the claims and wait until the plugins unprepared them all")
    p.add_argument("--timeout", type=flags.positive_float, default=300.0,
                   help="with --force: seconds to wait for the claims to be unprepared")
    p.add_argument("--daemonset", metavar="NAMESPACE/NAME", type=flags.namespaced_name, default=None,
                   help="the plugin's DaemonSet: --force when it carries the annotation gpushare.dev/uninstall=force "
                        "(the Helm chart's hook passes its own)")
    add_logging(p)
    p.set_defaults(run=lazy("dra_driver.uninstall", "run"))

    p = sub.add_parser("hook-path", formatter_class=Formatter,
                       help="print where libgpushare.so, the simulated driver and the probe are",
                       description="Print the paths of the native files shipped with this package.")
    p.add_argument("what", nargs="?", default=None,
                   choices=("library", "sim_dir", "sim_cuda", "sim_nvml", "probe"),
                   help="print only this path")
    p.set_defaults(run=_run_hook_path)

    p = sub.add_parser("install-hook", formatter_class=Formatter,
                       help="install libgpushare.so on the host (the DaemonSet's init container)",
                       description="Copy the shipped libgpushare.so into --dest as libgpushare-<hash>.so "
                                   "and point the symlink libgpushare.so at it. An installed file is "
                                   "never overwritten, because running containers map it.")
    p.add_argument("--dest", default="/opt/gpushare/lib", help="host folder (the plugin's --hook-dir)")
    p.add_argument("--with-sim", action="store_true",
                   help="also install the simulated CUDA driver and NVML into <dest>/sim (mock-GPU clusters)")
    add_logging(p)
    p.set_defaults(run=lazy("dra_driver.install", "run"))

    # The other programs' commands (the node program in kubeletplugin/, the playground) are
    # declared by those packages in the entry-point group COMMANDS_GROUP: this package imports neither.
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        entry.load()(sub)
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


def lazy(module: str, func: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import importlib

        command: Callable[[argparse.Namespace], int] = importlib.import_module(module).__dict__[func]
        return command(args)

    return run


def _run_discover(args: argparse.Namespace) -> int:
    """The GPUs as a mock GPU file (--mock-gpus FILE reads it back) plus the devices each
    sharing mode publishes for them; `auto` shows both modes, since the server decides."""
    import yaml

    from .controller.slices import desired_devices, mig_note
    from .discovery import make_backend, mock_entry

    gpus = make_backend(args.device_backend, args.mock_gpus, args.driver_root).discover()
    mig_gpus = GpuSet.parse(args.mig_gpus)
    modes = ("capacity", "partition") if args.sharing_mode == "auto" else (args.sharing_mode,)
    devices = {mode: [{"name": d["name"], **{k: c["value"] for k, c in d["capacity"].items()},
                       **({"taints": [t["value"] for t in d["taints"]]} if "taints" in d else {})}
                      for d in desired_devices(gpus, mode, args.partitions, taints=True, order=args.device_order,
                                               mig_gpus=mig_gpus)]
               for mode in modes}
    doc: dict[str, object] = {"gpus": [mock_entry(g) for g in gpus],
                              "sharing": {"mode": args.sharing_mode, "partitions": args.partitions},
                              "devices": devices}
    if mig_gpus:
        doc["mig"] = {"gpus": args.mig_gpus, "notes": [n for g in gpus if (n := mig_note(g, mig_gpus))]}
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
