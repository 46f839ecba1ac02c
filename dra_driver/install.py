"""`gpushare-dra install-hook`: put the native files on the host for containers to mount.

Runs as the DaemonSet's init container. Running containers map the library they were
started with, so a file once installed is never overwritten: each build is installed under
a name that carries its content hash (`libgpushare-<sha12>.so`), and the stable name
`libgpushare.so` is a symlink switched atomically (rename) to the newest. The kubelet
plugin resolves that symlink when it writes a claim's CDI spec, so all containers of one
claim map the same build even across an upgrade.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .flags import FromArgs
from .log import get_logger

log = get_logger("install-hook")

LIBRARY_NAME = "libgpushare.so"  # the stable name; builds are libgpushare-<sha12>.so beside it


def _sha12(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def install_versioned(source: Path, dest_dir: Path, stable_name: str) -> Path:
    """Install `source` as <stem>-<sha12><suffix> in dest_dir and point `stable_name` at it."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    stem, dot, suffix = stable_name.partition(".")
    versioned = dest_dir / f"{stem}-{_sha12(source)}{dot}{suffix}"
    if versioned.exists():
        log.info("already installed; left untouched", file=str(versioned))
    else:
        tmp = dest_dir / f".{versioned.name}.tmp-{os.getpid()}"
        shutil.copyfile(source, tmp)
        os.chmod(tmp, 0o755)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.rename(tmp, versioned)  # never replaces: the name did not exist
        log.info("installed", file=str(versioned))
    link_tmp = dest_dir / f".{stable_name}.link-{os.getpid()}"
    link_tmp.unlink(missing_ok=True)
    os.symlink(versioned.name, link_tmp)
    os.rename(link_tmp, dest_dir / stable_name)  # atomic switch of the stable name
    dir_fd = os.open(dest_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return versioned


def _versioned_pattern(stable_name: str) -> re.Pattern[str]:
    stem, dot, suffix = stable_name.partition(".")
    return re.compile(rf"^{re.escape(stem)}-[0-9a-f]{{12}}{re.escape(dot + suffix)}$")


def prune_versions(dest_dir: Path, stable_name: str, keep: set[str]) -> list[Path]:
    """Remove the versioned builds of `stable_name` in dest_dir that no path in `keep` names and
    the stable link does not point at (a newer init container may just have switched it).
    Returns what was removed; a folder we may not write is left alone (logged)."""
    keep = {os.path.realpath(k) for k in keep}
    link = dest_dir / stable_name
    if link.is_symlink():
        keep.add(os.path.realpath(link))
    pattern = _versioned_pattern(stable_name)
    removed: list[Path] = []
    try:
        names = sorted(os.listdir(dest_dir))
    except FileNotFoundError:
        return removed
    for name in names:
        path = dest_dir / name
        if not pattern.match(name) or os.path.realpath(path) in keep:
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:  # a read-only mount: nothing to prune here, say so once per call
            log.warning("cannot remove an unused library version", file=str(path), error=str(e))
            break
        removed.append(path)
        log.info("removed a library version no prepared claim uses", file=str(path))
    return removed


@dataclass(frozen=True)
class InstallConfig(FromArgs):
    """What `gpushare-dra install-hook` is started with."""

    dest: str = "/opt/gpushare/lib"
    with_sim: bool = False


def run(args: argparse.Namespace) -> int:
    return install(InstallConfig.from_args(args))


def install(config: InstallConfig) -> int:
    from .hookpath import native_paths

    paths = native_paths()
    dest = Path(config.dest)
    install_versioned(Path(paths["library"]), dest, LIBRARY_NAME)
    if config.with_sim:
        # The simulated driver for mock-GPU clusters: installed beside the library.
        for key, name in (("sim_cuda", "libcuda.so.1"), ("sim_nvml", "libnvidia-ml.so.1")):
            install_versioned(Path(paths[key]), dest / "sim", name)
    return 0
