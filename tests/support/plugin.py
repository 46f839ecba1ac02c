"""The kubelet plugin as the plugin suites start it: in this process, on mock GPUs, its
folders under one short root (unix socket paths are limited to 107 bytes)."""

from __future__ import annotations

import argparse
import os

from kubernetes import client

from dra_driver.cli import build_parser
from dra_driver.playground.claims import DRIVER, NODE
from kubeletplugin.main import Plugin

from . import BUILD

REAL_LIBRARY = str(BUILD / "libgpushare.so")


class Dirs:
    """The plugin's folders (flags) under one root."""

    def __init__(self, root: str):
        self.root = root
        self.plugin = os.path.join(root, "plugin")
        self.registry = os.path.join(root, "registry")
        self.state = os.path.join(root, "state")
        self.cdi = os.path.join(root, "cdi")

    @property
    def dra_socket(self) -> str:
        return os.path.join(self.plugin, "dra.sock")

    @property
    def reg_socket(self) -> str:
        return os.path.join(self.registry, f"{DRIVER}-reg.sock")

    def flags(self, hook_dir: str, cdi_root: str | None = None) -> list[str]:
        return ["--node-name", NODE, "--plugin-dir", self.plugin, "--registry-dir", self.registry,
                "--state-dir", self.state, "--cdi-root", cdi_root or self.cdi, "--hook-dir", hook_dir,
                "--device-backend", "mock", "--mock-gpus", "4x16Gi", "--partitions", "4",
                "--no-publish-slices", "--metrics-addr", "", "--healthcheck-port", "0"]


def plugin_args(dirs: Dirs, hook_dir: str, *extra: str, cdi_root: str | None = None) -> argparse.Namespace:
    """`gpushare-dra kubelet-plugin` flags on `dirs`, then `extra` (a later flag wins)."""
    return build_parser().parse_args(["kubelet-plugin", *dirs.flags(hook_dir, cdi_root), *extra])


def launch_plugin(api: client.ApiClient, dirs: Dirs, hook_dir: str, *extra: str, cdi_root: str | None = None) -> Plugin:
    """A started plugin in this process; the caller stops it."""
    return Plugin(plugin_args(dirs, hook_dir, *extra, cdi_root=cdi_root), api=api).start()
