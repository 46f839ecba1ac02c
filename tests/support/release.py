"""Releases as the upgrade test meets them: the version in its one place (pyproject.toml), the
releases CHANGELOG.md names (each with its commit), and a previous release's image and chart
built from its own commit, cached under .cache/releases/<version>-<commit>/ (built once: a
`git worktree` of the commit in a temporary folder runs its own hack/cluster/image)."""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tests.support import REPO

CACHE = REPO / ".cache" / "releases"
CLUSTER_IMAGE_CACHE = REPO / ".cache" / "cluster" / "image"  # hack/cluster/image's: the debootstrapped base
# Keep a Changelog's link reference of a release: `[0.1.0]: https://.../commit/<40 hex>`.
RELEASE_LINK = re.compile(r"^\[(\d+\.\d+\.\d+)\]: \S+/commit/([0-9a-f]{40})$", re.M)


def version() -> str:
    """The working tree's version: pyproject.toml's, the one place it is written."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def releases() -> dict[str, str]:
    """Every release CHANGELOG.md names, newest first: version -> its commit."""
    return dict(RELEASE_LINK.findall((REPO / "CHANGELOG.md").read_text()))


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    image: Path  # a docker-archive tarball of its product image, tagged gpushare-dra:VERSION
    chart: Path  # its deploy/helm/gpushare-dra (in a copy of its deploy/)


def previous() -> tuple[str, str]:
    """The newest release CHANGELOG.md names other than the working tree's version."""
    mine = version()
    return next((v, c) for v, c in releases().items() if v != mine)


def build_previous() -> Release:
    """The previous release's image and chart, from its commit (built once, then cached)."""
    ver, commit = previous()
    home = CACHE / f"{ver}-{commit[:12]}"
    release = Release(ver, commit, home / "image.tar", home / "deploy" / "helm" / "gpushare-dra")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "deploy").is_dir():
            _extract_deploy(commit, home)
        if not release.image.exists():
            _build_image(commit, release.image, f"gpushare-dra:{ver}")
    return release


def _git(*args: str, cwd: Path = REPO) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} exited {out.returncode}: {out.stderr.strip()} "
                           "(the previous release's commit must be in this clone's history: not a shallow clone)")
    return out.stdout


def _extract_deploy(commit: str, home: Path) -> None:
    """The commit's deploy/ into home (its chart's files/ link into deploy/base)."""
    tmp = home / "deploy.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    archive = subprocess.run(["git", "archive", commit, "deploy"], cwd=REPO,
                             capture_output=True, check=True, timeout=120).stdout
    tar = tmp / "deploy.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(tmp, filter="data")
    (tmp / "deploy").rename(home / "deploy")
    shutil.rmtree(tmp)


def _build_image(commit: str, dest: Path, tag: str) -> None:
    """The commit's own hack/cluster/image in a detached worktree, with a cache of its own (it
    keeps one product tarball per cache) seeded with a copy of the debootstrapped base. Tagged
    `tag` only: 0.1.0 tagged its image gpushare-dra:dev, the name the working tree's image has."""
    with tempfile.TemporaryDirectory(prefix="gpushare-release.") as tmp:
        tree, cache = Path(tmp) / "tree", Path(tmp) / "cluster"
        _git("worktree", "add", "--detach", str(tree), commit)
        try:
            base = CLUSTER_IMAGE_CACHE / "base-bookworm"
            if base.is_dir():
                (cache / "image").mkdir(parents=True)
                subprocess.run(["cp", "-a", str(base), str(cache / "image" / "base-bookworm")], check=True)
            env = os.environ | {"CLUSTER_CACHE": str(cache)}
            out = subprocess.run([str(tree / "hack" / "cluster" / "image"), "product"], cwd=tree, env=env,
                                 capture_output=True, text=True, timeout=3600)
            if out.returncode != 0:
                raise RuntimeError(f"hack/cluster/image of {commit[:12]} exited {out.returncode}:\n"
                                   f"{out.stderr[-3000:]}")
            retag(Path(out.stdout.strip().splitlines()[-1]), dest, tag)
        finally:
            _git("worktree", "remove", "--force", str(tree))


def retag(src: Path, dest: Path, tag: str) -> None:
    """A copy of the docker archive src whose one image is named tag alone (manifest.json's RepoTags)."""
    tmp = dest.with_suffix(".partial")
    with tarfile.open(src) as old, tarfile.open(tmp, "w") as new:
        for member in old:
            data = old.extractfile(member) if member.isfile() else None
            if member.name == "manifest.json" and data is not None:
                manifest = json.loads(data.read())
                manifest[0]["RepoTags"] = [tag]
                body = json.dumps(manifest).encode()
                member.size = len(body)
                data = io.BytesIO(body)
            new.addfile(member, data)
    tmp.rename(dest)
