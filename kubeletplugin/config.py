"""PluginConfig: everything `gpushare-dra kubelet-plugin` is started with, typed and frozen.

Built in one place from the command line and the GPUSHARE_* variables (`from_args`, after
dra_driver.cli parsed them); the playground, tests and benchmarks build one directly. The flag
definitions (commands.py) take their defaults from here, so a default is written once.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Literal

from dra_driver.cli import DEFAULT_DRIVER_NAME
from dra_driver.devicemodel import BINPACK

SharingMode = Literal["auto", "capacity", "partition"]


@dataclass(frozen=True)
class PluginConfig:
    node_name: str = ""  # required; the CLI fills it from NODE_NAME
    kubeconfig: str | None = None
    driver_name: str = DEFAULT_DRIVER_NAME
    # kubelet plugin
    plugin_dir: str | None = None  # None: /var/lib/kubelet/plugins/<driver_name>
    registry_dir: str = "/var/lib/kubelet/plugins_registry"
    pod_uid: str = ""
    handover_timeout: float = 20.0  # with pod_uid: seconds a stopping plugin serves on, awaiting its successor
    cdi_root: str = "/var/run/cdi"
    state_dir: str = "/var/lib/gpushare"
    hook_dir: str | None = None  # None: the library shipped in this package
    mps_control: tuple[str, ...] = ("nvidia-cuda-mps-control",)
    mps_gpus: str = "none"  # GPUs that serve MPS claims only (none, all, 0,2): dra_driver/config/strategies.py
    mixed_strategies: bool = False  # every GPU serves every strategy (MPS beside TimeSlicing and None)
    mig_gpus: str = "none"  # GPUs offered as MIG devices when in MIG mode (none, all, 0,2): docs/mig.md
    metrics_addr: str = ":9400"  # "": no metrics endpoint
    healthcheck_port: int = 51515  # 0: no liveness endpoint
    publish_slices: bool = True
    agent_interval: float = 1.0
    backstop_interval: float = 0.05
    enforce: Literal["report", "kill"] = "kill"
    # GPU health
    health_events: bool = True
    unhealthy_taint_effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    health_recovery_seconds: float = 300.0
    health_ignore_xids: frozenset[int] | Literal["all"] = frozenset()
    # GPUs and sharing
    device_backend: Literal["nvml", "mock"] = "nvml"
    mock_gpus: str | None = None  # None: 1x16Gi
    driver_root: str | None = None
    sharing_mode: SharingMode = "auto"
    partitions: int = 8
    device_order: str = BINPACK

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PluginConfig:
        """The parsed `kubelet-plugin` flags (each already checked by its flag's type)."""
        values = {f.name: getattr(args, f.name) for f in fields(cls)}
        values["mps_control"] = tuple(values["mps_control"])
        values["node_name"] = values["node_name"] or ""
        return cls(**values)


DEFAULTS = PluginConfig()
