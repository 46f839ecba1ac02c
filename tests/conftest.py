"""Fixtures shared by the suites: API emulators, the kubelet plugin on mock GPUs and the
kubelet stand-in that talks to it. Helpers that are not fixtures live in tests/support/;
each folder's conftest.py holds only that folder's fixtures."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from kubernetes import client

from kubeletplugin.claimfiles import unmount_all_regions
from kubeletplugin.main import Plugin
from playground.emulator import ApiEmulator
from playground.kubelet import Kubelet
from tests.support import ALONE, neighbours
from tests.support.neighbours import Neighbours
from tests.support.plugin import REAL_LIBRARY, Dirs, launch_plugin

# `make test` runs the suite in parts (Makefile): the real cluster beside the rest on pytest-xdist
# workers (`-m "not serial" -n 4`), then what is marked `serial` on two workers, alone. Serial: the
# suites that measure CPU or GPU time over fixed windows on the simulator (they flake when they wait
# for a core; each uses about a third of one), the real cluster (one cluster, its own session
# fixtures), and every file with a CPU_TIMED test.
# `pytest` alone runs everything, one test at a time, as before.
SERIAL = (
    "tests/hook/",
    "tests/cluster/",
    "tests/e2e/test_e2e.py",  # the demo's checks read each strategy's share of the simulated GPU
    "tests/agent/test_short_holds.py",  # holds timed to the backstop's polls
    "tests/agent/test_backstop_bound.py",  # holds before the kill held to the 200 ms promise
    "tests/agent/test_mps_daemon_attacks.py",  # Events within 2 s of the daemon's end (agent period 0.5 s)
)
# In SERIAL's folders but timing nothing: they run beside the rest.
NOT_SERIAL = ("tests/hook/test_sanitizers.py",  # builds and runs the library under ASan, TSan, valgrind
              "tests/hook/test_replay.py",  # the probe's trace parser: nothing timed
              # what the library and the simulator do, not how fast: layouts, loading, memory
              # limits, MIG, images' baselines, SM counts, the profile converter
              "tests/hook/test_hooklayout.py", "tests/hook/test_loading.py", "tests/hook/test_packaging.py",
              "tests/hook/test_memory.py", "tests/hook/test_sim_mig.py", "tests/hook/test_baseline.py",
              "tests/hook/test_mps_sm_count.py", "tests/hook/test_trace_from_profile.py",
              "tests/hook/test_sim_visible.py")  # which GPUs a process sees
# On xdist workers (`--dist loadfile --no-loadscope-reorder`) these files start first, so that none
# of them is still running alone at the end: test_crash.py is about a fifth of the parallel part,
# test_compute_shares.py and test_compute_guard.py each a sixth of the serial part.
FIRST = ("tests/agent/test_image_matrix.py", "tests/kubeletplugin/test_crash.py", "tests/hook/test_sanitizers.py",
         "tests/dra_driver/test_cli.py",
         "tests/controller/test_controller_reconcile.py", "tests/deploy/test_admission.py",
         "tests/hook/test_compute_shares.py", "tests/agent/test_compute_guard.py")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.hookimpl(tryfirst=True)  # before -m selects on the mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    timed = {item.path for item in items if item.get_closest_marker("flaky")}  # CPU_TIMED
    where = {item: os.path.relpath(item.path, _ROOT).replace(os.sep, "/") for item in items}
    for item in items:
        if (where[item].startswith(SERIAL) and not where[item].startswith(NOT_SERIAL)) or item.path in timed:
            item.add_marker(pytest.mark.serial)
        if where[item] in ALONE:  # real-time priority: after the other serial files
            item.add_marker(pytest.mark.alone)
    if hasattr(config, "workerinput"):  # the same order in every worker, as xdist requires
        items.sort(key=lambda item: FIRST.index(where[item]) if where[item] in FIRST else len(FIRST))


# Other software on the host for the whole run (tests/support/neighbours.py: other vendors' CDI
# specs, a gpushare spec of another run (its own state dir), a process in another kubelet's kubepods cgroup, a
# podman container of another owner): the suite passes among them, and they are there unchanged
# at its end, or the run fails naming what it removed. Planted once per run (not per xdist worker).
NEIGHBOURS = pytest.StashKey[Neighbours]()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput") and neighbours.why_not() is None:
        session.config.stash[NEIGHBOURS] = Neighbours(f"suite{os.getpid()}").plant()


def pytest_sessionfinish(session: pytest.Session) -> None:
    planted = session.config.stash.get(NEIGHBOURS, None)
    if planted is None:
        return
    missing = planted.missing()
    planted.remove()
    if missing:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"FAILED: the suite removed or ended other software's: {missing}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _pytests(handler: logging.Handler) -> bool:
    return type(handler).__module__.startswith("_pytest")


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Logging as each test found it. A test that runs a program's main in-process (the CLI,
    dra_driver.log.configure) sets the root logger's level and handler for the whole process:
    the rest of the suite then logged at debug (cel-python's per-step records made one emulator
    test take 24 s) into a stderr that pytest had since closed ("I/O operation on closed file")."""
    root = logging.getLogger()
    level, handlers = root.level, [h for h in root.handlers if not _pytests(h)]
    levels = {name: logging.getLogger(name).level for name in ("urllib3", "kubernetes.client.rest")}
    config = structlog.get_config()
    yield
    structlog.configure(**config)
    root.setLevel(level)
    root.handlers[:] = handlers + [h for h in root.handlers if _pytests(h)]  # this phase's capture stays
    for name, saved in levels.items():
        logging.getLogger(name).setLevel(saved)


@pytest.fixture
def make_emulator() -> Iterator[Callable[..., ApiEmulator]]:
    """make_emulator(**options) -> a fresh, started API emulator, stopped after the test."""
    started: list[ApiEmulator] = []

    def make(**options: Any) -> ApiEmulator:
        emu = ApiEmulator(**options).start()
        started.append(emu)
        return emu

    yield make
    for emu in started:
        emu.stop()


@pytest.fixture
def emulator(make_emulator: Callable[..., ApiEmulator]) -> ApiEmulator:
    """A fresh API server of this test, with the gates the driver uses."""
    return make_emulator(consumable_capacity=True, device_taints=True)


@pytest.fixture(scope="session")
def shared_emulator() -> Iterator[ApiEmulator]:
    """One API server for the plugin suites: their claims have unique names, so they share it."""
    with ApiEmulator(consumable_capacity=True) as emu:
        yield emu


@pytest.fixture(scope="session")
def api(shared_emulator: ApiEmulator) -> client.ApiClient:
    return shared_emulator.api_client()


@pytest.fixture(scope="session")
def hook_dir() -> Iterator[str]:
    """A folder with libgpushare.so: the real one when `make hook` built it, else a stand-in."""
    folder = tempfile.mkdtemp(prefix="gshook")
    target = os.path.join(folder, "libgpushare.so")
    if os.path.isfile(REAL_LIBRARY):
        shutil.copy(REAL_LIBRARY, target)
    else:
        with open(target, "wb") as f:
            f.write(b"not a real library: hook/build was not built\n")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def dirs() -> Iterator[Dirs]:
    root = tempfile.mkdtemp(prefix="gskp")
    yield Dirs(root)
    unmount_all_regions(Dirs(root).state)  # claims a test left prepared
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def start_plugin(api: client.ApiClient, dirs: Dirs, hook_dir: str) -> Iterator[Callable[..., Plugin]]:
    """start_plugin(cdi_root=None, **changes) -> Plugin running in this process on `dirs`, its
    configuration changed by `changes` (PluginConfig's fields); stopped at the end."""
    running: list[Plugin] = []

    def start_one(cdi_root: str | None = None, **changes: Any) -> Plugin:
        plugin = launch_plugin(api, dirs, changes.pop("hook_dir", hook_dir), cdi_root, **changes)
        running.append(plugin)
        return plugin

    yield start_one
    for plugin in running:
        plugin.stop(grace=1)


@pytest.fixture
def plugin(start_plugin: Callable[..., Plugin]) -> Plugin:
    return start_plugin()


@pytest.fixture
def kubelet(plugin: Plugin, dirs: Dirs) -> Iterator[Kubelet]:
    k = Kubelet(dirs.dra_socket, dirs.reg_socket)
    yield k
    k.close()
