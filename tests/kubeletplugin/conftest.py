from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from dra_driver.cli import build_parser
from dra_driver.playground.emulator import ApiEmulator
from kubeletplugin.main import Plugin

from .kubelet import DRIVER, NODE, Kubelet

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REAL_LIBRARY = os.path.join(REPO, "hook", "build", "libgpushare.so")


@pytest.fixture(scope="session")
def emulator():
    emu = ApiEmulator(consumable_capacity=True).start()
    yield emu
    emu.stop()


@pytest.fixture(scope="session")
def api(emulator):
    return emulator.api_client()


@pytest.fixture(scope="session")
def hook_dir():
    """A folder with libgpushare.so: the real one when `make -C hook` built it, else a stand-in."""
    folder = tempfile.mkdtemp(prefix="gshook")
    target = os.path.join(folder, "libgpushare.so")
    if os.path.isfile(REAL_LIBRARY):
        shutil.copy(REAL_LIBRARY, target)
    else:
        with open(target, "wb") as f:
            f.write(b"not a real library: hook/build was not built\n")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


class Dirs:
    """Short paths (unix socket paths are limited to 107 bytes)."""

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


@pytest.fixture
def dirs():
    root = tempfile.mkdtemp(prefix="gskp")
    yield Dirs(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def start_plugin(api, dirs, hook_dir):
    """start_plugin(*extra_flags) -> Plugin running in this process on `dirs`; stopped at the end."""
    running: list[Plugin] = []

    def start(*extra: str, cdi_root: str | None = None) -> Plugin:
        args = build_parser().parse_args(["kubelet-plugin", *dirs.flags(hook_dir, cdi_root), *extra])
        plugin = Plugin(args, api=api).start()
        running.append(plugin)
        return plugin

    yield start
    for plugin in running:
        plugin.stop(grace=1)


@pytest.fixture
def plugin(start_plugin):
    return start_plugin()


@pytest.fixture
def kubelet(plugin, dirs):
    k = Kubelet(dirs.dra_socket, dirs.reg_socket)
    yield k
    k.close()
