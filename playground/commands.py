"""The playground's subcommands (`gpushare-dra demo`, `playground`, `emulator`).

The CLI finds them through the entry-point group dra_driver.cli.COMMANDS_GROUP (pyproject.toml)
and never imports the playground. This module only declares the flags, so `--help` works
without the `demo` extra; each command's code is imported when
it runs, and a missing `demo` dependency is reported here, in one line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

from dra_driver import flags
from dra_driver.cli import SHARING_MODES, Formatter, add_logging

# The modules the `demo` extra installs (the emulator's schemas, the allocation stand-in's CEL).
DEMO_EXTRA_MODULES = frozenset({"jsonschema", "kubernetes_validate", "referencing", "celpy"})

Runner = Callable[[argparse.Namespace], int]


def missing_demo_extra() -> str | None:
    """The first module of the `demo` extra that cannot be imported, else None."""
    for name in sorted(DEMO_EXTRA_MODULES):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            return name
    return None


def _needs_demo_extra(module: str, func: str) -> Runner:
    def run(args: argparse.Namespace) -> int:
        missing = missing_demo_extra()
        try:
            if missing is None:
                return int(getattr(importlib.import_module(module), func)(args) or 0)
        except ModuleNotFoundError as e:
            if e.name not in DEMO_EXTRA_MODULES:
                raise
            missing = e.name
        print(f"gpushare-dra {args.command}: error: needs the optional 'demo' dependencies "
              f"({missing} is missing); install them with: pip install 'gpushare-dra[demo]'",
              file=sys.stderr)
        return 2

    return run


def add_commands(sub: Any) -> None:
    """Add `demo`, `playground` and `emulator` to the CLI's subparsers."""
    p = sub.add_parser("demo", formatter_class=Formatter,
                       help="run the whole path on simulated GPUs with no cluster",
                       description="Start an in-process Kubernetes API emulator and simulated GPUs, "
                                   "then walk through publishing, allocating, preparing and enforcing a "
                                   "shared claim, saying what each step shows. Exits non-zero if a step "
                                   "does not behave.")
    p.add_argument("--mock-gpus", default="2x80Gi", help="simulated GPUs (see kubelet-plugin --help)")
    p.add_argument("--workdir", default=None, help="folder for the demo's files (default: a temporary one)")
    p.add_argument("--strategies", action="store_true",
                   help="instead: one claim of each sharing strategy (TimeSlicing, MPS, None) on one GPU, run at "
                        "once, and what each held (docs/strategies.md)")
    _add_runtime(p)
    add_logging(p)
    # The story is the output; component logs only when something goes wrong.
    p.set_defaults(run=_needs_demo_extra("playground.demos", "run"), log_level="warning")

    p = sub.add_parser("playground", formatter_class=Formatter,
                       help="a one-node cluster on simulated GPUs where `kubectl apply` runs pods",
                       description="Serve the Kubernetes API emulator with a cluster behind it: the resourceclaim "
                                   "controller, a scheduler that allocates claims and binds pods, and one node "
                                   "running the real kubelet plugin on simulated GPUs, whose kubelet prepares "
                                   "claims and runs each pod's containers with their CDI devices "
                                   "(docs/emulator.md, Playground).")
    _add_emulator_flags(p)
    p.add_argument("--node-name", default="playground-node", help="the node's name (its ResourceSlice pool)")
    p.add_argument("--mock-gpus", default="2x80Gi", help="the node's simulated GPUs (see kubelet-plugin --help)")
    p.add_argument("--health-recovery-seconds", type=flags.positive_float, default=300.0,
                   help="the node's kubelet-plugin --health-recovery-seconds: how long after a simulated XID "
                        "its GPU is healthy again")
    p.add_argument("--sharing-mode", default="auto", choices=SHARING_MODES,
                   help="how the node's kubelet plugin publishes its GPUs (see kubelet-plugin --help): partition "
                        "gives share devices, for pods that ask for gpushare.dev/share; auto: capacity here")
    p.add_argument("--mps-gpus", default="none",
                   help="the node's kubelet-plugin --mps-gpus: GPUs that serve MPS claims only (none, all, 0,2), "
                        "which pods reach through DeviceClass mps.gpushare.dev")
    p.add_argument("--mixed-strategies", default=False, action=argparse.BooleanOptionalAction,
                   help="the node's kubelet-plugin --mixed-strategies: every GPU serves every strategy")
    p.add_argument("--mig-gpus", default="none",
                   help="the node's kubelet-plugin --mig-gpus: GPUs offered as MIG devices (none, all, 0,2) when in "
                        "MIG mode, which a --mock-gpus file sets per GPU (migMode: true); pods reach them through "
                        "DeviceClass mig.gpushare.dev (docs/mig.md)")
    p.add_argument("--workdir", default=None,
                   help="folder for the node's files: plugin state, CDI specs, container logs (default: a "
                        "temporary one, removed on exit)")
    _add_runtime(p)
    add_logging(p)
    p.set_defaults(run=_needs_demo_extra("playground.cluster", "run"))

    p = sub.add_parser("emulator", formatter_class=Formatter,
                       help="serve the Kubernetes API emulator alone (tests, hack scripts); nothing runs pods",
                       description="Serve an in-memory Kubernetes API (Nodes, Pods, Events, "
                                   "resource.k8s.io/v1) for local runs without a cluster. Nothing allocates "
                                   "claims or runs pods: `gpushare-dra playground` does.")
    _add_emulator_flags(p)
    add_logging(p)
    p.set_defaults(run=_needs_demo_extra("playground.emulator.__main__", "run"))


def _add_runtime(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", default="auto", choices=("auto", "podman", "process"),
                   help="how containers run: podman (real CDI consumer, needs root, podman and runc), "
                        "process (the CDI spec applied to host processes), auto: podman when it can run")


def _add_emulator_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=flags.port, default=8001, help="TCP port (0: any free port)")
    p.add_argument("--consumable-capacity", default=None, action=argparse.BooleanOptionalAction,
                   help="keep DRAConsumableCapacity fields, as a server with that feature gate does "
                        "(default: as --kube-version does by default: on from 1.36)")
    p.add_argument("--device-taints", default=None, action=argparse.BooleanOptionalAction,
                   help="keep device taints in ResourceSlices, as a server with DRADeviceTaints does "
                        "(default: as --kube-version does by default: on from 1.36)")
    p.add_argument("--validate", default=True, action=argparse.BooleanOptionalAction,
                   help="refuse resource.k8s.io objects the upstream OpenAPI schemas refuse")
    p.add_argument("--kube-version", default=None,
                   help="Kubernetes version (MAJOR.MINOR) whose schemas to use; one of those kubernetes-validate "
                        "ships (default: the newest)")
    p.add_argument("--kubeconfig-out", default=None, help="write a kubeconfig for the emulator here")
