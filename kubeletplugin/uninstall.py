"""`gpushare-dra cleanup`: delete the driver's slices and, with --node-state, remove what the kubelet
plugin left on this node.

The plugin keeps its state on shutdown on purpose (a restart or an upgrade must find every
prepared claim); after an uninstall nothing uses it. Removed: the CDI specs (kind
k8s.gpushare.dev/claim) in --cdi-root that this --state-dir's plugin wrote (they mount its claim
folders, or name a claim its checkpoint or claim folders hold: another plugin's specs in a shared
CDI root stay); the checkpoint, claim folders, lock files and
simulated-GPU state in --state-dir; with --hook-dir, the installed libraries. Only names we create are touched, so a
folder shared with something else keeps that something.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
from dataclasses import dataclass

from kubernetes import client

from cdi import SpecDir
from dra_driver.cli import DEFAULT_DRIVER_NAME
from dra_driver.controller import delete_slices
from dra_driver.flags import FlagError, FromArgs
from dra_driver.kube import api_client as make_api_client
from dra_driver.kube import api_error
from dra_driver.log import get_logger

from . import checkpoint as ckpt
from .cdispec import KIND, written_by
from .claimfiles import ClaimFiles, unmount_all_regions
from .config import DEFAULTS
from .instances import LOCK_FILES, REGISTERED_DIR

log = get_logger("cleanup")

CHECKPOINT = "checkpoint.json"
# with the leftovers of an interrupted atomic write (this release's and older ones'), corrupt
# checkpoints moved aside, and the lock files two plugin instances share (instances.py)
STATE_NAMES = (CHECKPOINT, f"{CHECKPOINT}.journal", f"{CHECKPOINT}.corrupt-*", f".{CHECKPOINT}.*.tmp",
               f".tmp-*-{CHECKPOINT}", "claims", "sim.state", *LOCK_FILES, REGISTERED_DIR)
HOOK_NAMES = ("libgpushare.so", "libgpushare-*.so", ".libgpushare*", "sim/libcuda*.so.1", "sim/libnvidia-ml*.so.1",
              "sim/.lib*")


class NodeStateInUse(RuntimeError):
    """Claims are still prepared here: their containers may be running on these files."""


def prepared_claims(state_dir: str) -> dict[str, str]:
    """uid -> `namespace/name` of every claim the checkpoint holds (a corrupt checkpoint: the
    claim folders, uid -> uid)."""
    cp = ckpt.Checkpoint(os.path.join(state_dir, CHECKPOINT), None)
    try:
        cp.load()
        return {uid: f"{e.namespace}/{e.name}" for uid, e in cp.items()}
    except ckpt.CheckpointCorrupt:
        return {uid: uid for uid in ClaimFiles(state_dir).uids()}


def remove_node_state(state_dir: str, cdi_root: str, hook_dir: str | None = None,
                      force: bool = False) -> dict[str, int]:
    """Remove our files; returns counts by kind. NodeStateInUse unless `force` when claims are prepared."""
    prepared = prepared_claims(state_dir)
    in_use = sorted(prepared.values())
    if in_use and not force:
        raise NodeStateInUse(f"--state-dir {state_dir}: {len(in_use)} claim(s) still prepared on this node "
                             f"({', '.join(in_use[:5])}{', ...' if len(in_use) > 5 else ''}); delete the pods "
                             "that use them first, or pass --force")
    specs, files = SpecDir(cdi_root, KIND), ClaimFiles(state_dir)
    held = prepared.keys() | files.uids()
    names = {n for n in specs.names() if n in held or written_by(specs, n, files)}
    for name in names:
        specs.remove(name)
    counts = {"cdi_specs": len(names), "state_entries": _remove(state_dir, STATE_NAMES), "hook_files": 0}
    if hook_dir:
        counts["hook_files"] = _remove(hook_dir, HOOK_NAMES)
        _rmdir_if_empty(os.path.join(hook_dir, "sim"))
        _rmdir_if_empty(hook_dir)
    _rmdir_if_empty(state_dir)
    log.info("node state removed", state_dir=state_dir, cdi_root=cdi_root, hook_dir=hook_dir, **counts)
    return counts


def _remove(folder: str, patterns: tuple[str, ...]) -> int:
    removed = 0
    for pattern in patterns:
        for path in glob.glob(os.path.join(glob.escape(folder), pattern)):
            if os.path.isdir(path) and not os.path.islink(path):
                if pattern == "claims":
                    unmount_all_regions(folder)
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed += 1
    return removed


def _rmdir_if_empty(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:  # missing, or holds something that is not ours
        pass


@dataclass(frozen=True)
class CleanupConfig(FromArgs):
    """What `gpushare-dra cleanup` is started with."""

    node_name: str | None = None
    kubeconfig: str | None = None
    driver_name: str = DEFAULT_DRIVER_NAME
    all_nodes: bool = False
    node_state: bool = False
    keep_slices: bool = False
    state_dir: str = DEFAULTS.state_dir
    cdi_root: str = DEFAULTS.cdi_root
    hook_dir: str | None = None
    force: bool = False

    def __post_init__(self) -> None:
        if self.keep_slices and not self.node_state:
            raise FlagError("--keep-slices", "only with --node-state (otherwise there is nothing to do)")
        if not self.keep_slices and not self.all_nodes and not self.node_name:
            raise FlagError("--node-name", "required (or set NODE_NAME) to delete one node's slices; "
                                           "--all-nodes deletes every node's")


def run_cleanup(args: argparse.Namespace) -> int:
    return cleanup(CleanupConfig.from_args(args))


def cleanup(config: CleanupConfig) -> int:
    if config.node_state:  # first: refused while claims are prepared, before anything is deleted
        try:
            remove_node_state(config.state_dir, config.cdi_root, config.hook_dir, force=config.force)
        except NodeStateInUse as e:
            log.error("cleanup refused", error=str(e))
            return 1
    if config.keep_slices:
        return 0
    node = None if config.all_nodes else config.node_name
    try:
        deleted = delete_slices(make_api_client(config.kubeconfig), config.driver_name, node)
    except client.ApiException as e:
        log.error("cleanup failed", error=api_error(e))
        return 1
    log.info("deleted ResourceSlices", driver=config.driver_name, node=node or "<all nodes>", count=deleted)
    return 0
