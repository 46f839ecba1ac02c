"""Root filesystems of real distributions, for the image matrix (tests/agent/test_image_matrix.py).

Built from Debian's package registry, never from the host's own /lib:

- `glibc_root(suite)`: `debootstrap --variant=minbase` of bullseye (glibc 2.31), bookworm (2.36)
  or trixie (2.41), with the probe (built to the glibc 2.17 baseline, hook/src/baseline.h)
  copied in;
- `musl_root()`: Debian's `musl` package (its loader and libc, as an Alpine image has them) and
  the probe compiled for musl with the package's `musl-gcc` (musl-tools).

Each debootstrap root is built once, in `.cache/roots/<suite>` under the repository (or
`$GPUSHARE_TEST_ROOTS`), under a lock, into a temporary folder renamed when complete: a killed
build is never taken for a root. A cold build takes about 30 s per suite here; later runs reuse
it. The mirror is the one this machine's apt sources name (what debootstrap users expect);
`GPUSHARE_DEBIAN_MIRROR` names another.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

from playground.containers import PodmanRunner

from . import BUILD, REPO

# suite -> the glibc version its libc6 has (what the image matrix expects to find inside)
GLIBC_SUITES = {"bullseye": "2.31", "bookworm": "2.36", "trixie": "2.41"}
CACHE = Path(os.environ.get("GPUSHARE_TEST_ROOTS") or REPO / ".cache" / "roots").resolve()  # runc: no links
PROBE = "/usr/local/bin/gpushare-probe"  # where each root has the probe
MUSL_LOADER = "/lib/ld-musl-x86_64.so.1"
# the probe for musl: the same source, without the glibc baseline (musl has no symbol versions)
PROBE_SOURCE = REPO / "hook" / "tools" / "gpushare-probe.c"


def apt_mirror(sources: Path = Path("/etc/apt")) -> str | None:
    """The Debian archive this machine's apt sources name (not its -security or -updates suites):
    deb822 `.sources` files and one-line `.list` files. None when they name none."""
    files = [sources / "sources.list", *sorted((sources / "sources.list.d").glob("*.list")),
             *sorted((sources / "sources.list.d").glob("*.sources"))]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":
            for stanza in text.split("\n\n"):
                fields = dict(line.split(":", 1) for line in stanza.splitlines()
                              if ":" in line and not line.startswith(("#", " ")))
                uris, suites = fields.get("URIs", "").split(), fields.get("Suites", "").split()
                if fields.get("Types", "deb").split().count("deb") and uris and _main_suite(suites):
                    return uris[0]
        else:
            for line in text.splitlines():
                words = [w for w in line.split() if not w.startswith("[")]  # drop [options]
                if len(words) >= 3 and words[0] == "deb" and _main_suite(words[2:3]):
                    return words[1]
    return None


def _main_suite(suites: list[str]) -> bool:
    return any(not s.endswith(("-security", "-updates", "-backports")) for s in suites)


def mirror() -> str | None:
    """Where debootstrap takes packages from: $GPUSHARE_DEBIAN_MIRROR, else the host's apt mirror,
    else debootstrap's own default (None)."""
    return os.environ.get("GPUSHARE_DEBIAN_MIRROR") or apt_mirror()


def podman_why_not() -> str | None:
    """None when claims can run in these roots under podman here, else why not (tests skip)."""
    return why_not() or PodmanRunner.available()


def run_ok(runner, ids: list[str], argv: list[str]) -> subprocess.CompletedProcess:
    """argv in a container of the claim's CDI devices (a PodmanRunner on a root); it must exit 0."""
    proc = runner.run(ids, argv)
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc


def why_not() -> str | None:
    """None when roots can be built here, else why not (the tests skip with it)."""
    if os.geteuid() != 0:
        return "building root filesystems needs root (debootstrap)"
    missing = [tool for tool in ("debootstrap", "musl-gcc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install -y debootstrap musl-tools)"
    if not os.path.exists(MUSL_LOADER):
        return f"{MUSL_LOADER} missing (apt-get install -y musl)"
    return None


@contextmanager
def _locked():
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def glibc_root(suite: str) -> Path:
    """The suite's minbase root with the current probe in it."""
    root = CACHE / suite
    with _locked():
        if not root.is_dir():
            tmp = CACHE / f"{suite}.partial"
            source = mirror()
            command = ["debootstrap", "--variant=minbase", suite, str(tmp), *([source] if source else [])]
            for _attempt in range(2):  # once more after a mirror's hiccup; a second failure is real
                shutil.rmtree(tmp, ignore_errors=True)
                proc = subprocess.run(command, capture_output=True, text=True, timeout=1200)
                if proc.returncode == 0:
                    break
            if proc.returncode != 0:
                tail = (proc.stdout + proc.stderr)[-2000:]
                where = source or "its default mirror"
                raise RuntimeError(f"debootstrap {suite} from {where} failed ({proc.returncode}):\n{tail}")
            tmp.rename(root)
        _install(BUILD / "gpushare-probe", root)
    return root


def musl_root() -> Path:
    """Debian's musl loader and libc, and the probe compiled against them; nothing else."""
    root = CACHE / "musl"
    with _locked():
        shutil.rmtree(root, ignore_errors=True)  # seconds to make: always from the current sources
        for d in ("bin", "etc", "proc", "sys", "dev", "tmp", "var/run", "usr/local/bin"):
            (root / d).mkdir(parents=True, exist_ok=True)
        files = subprocess.run(["dpkg", "-L", "musl"], capture_output=True, text=True, check=True).stdout.split()
        for f in files:  # the loader, libc.so and the loader's path file
            if os.path.isfile(f) and not f.startswith("/usr/share/"):
                target = root / f.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target, follow_symlinks=False)
        subprocess.run(["musl-gcc", "-std=gnu11", "-O2", "-o", str(root / PROBE.lstrip("/")), str(PROBE_SOURCE)],
                       check=True, capture_output=True, text=True)
    return root


def _install(program: Path, root: Path) -> None:
    target = root / PROBE.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(program, target)
