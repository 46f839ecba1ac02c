"""The files we inject into containers load in the images users run (issue 18, docs/images.md).

glibc: nothing asks for a symbol version newer than GLIBC_2.17 and nothing depends on a
library a minimal image lacks (hook/src/baseline.h). musl: the library loads under musl's
loader and its dlsym stays musl's own (the rest, in real roots: tests/agent/test_image_matrix.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.support import REPO

BASELINE = (2, 17)
INJECTED = ["libgpushare.so", "sim/libcuda.so.1", "sim/libnvidia-ml.so.1", "gpushare-probe"]
# every glibc since 2.17 ships these three; musl answers all three names itself
MINIMAL_IMAGE_LIBRARIES = {"libc.so.6", "libdl.so.2", "libpthread.so.0"}


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def needed_versions(path) -> set[str]:
    """The version names the file asks its dependencies for (its .gnu.version_r)."""
    return set(re.findall(r"Name: (\S+)\s+Flags", readelf("-V", str(path))))


def too_new(version: str) -> bool:
    m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", version)
    return m is None or (int(m[1]), int(m[2])) > BASELINE  # GLIBC_ABI_DT_RELR and the like count as new


@pytest.mark.parametrize("name", INJECTED)
def test_nothing_newer_than_glibc_2_17(build, name):
    versions = needed_versions(build / name)
    assert versions, f"{name}: no version needs read; readelf output changed?"
    assert not [v for v in versions if v.startswith("GLIBC") and too_new(v)], sorted(versions)


@pytest.mark.parametrize("name", INJECTED)
def test_depends_only_on_what_a_minimal_image_has(build, name):
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf("-d", str(build / name))))
    assert needed and needed <= MINIMAL_IMAGE_LIBRARIES, needed


def test_the_check_catches_a_new_version():
    assert too_new("GLIBC_2.34") and too_new("GLIBC_ABI_DT_RELR") and not too_new("GLIBC_2.2.5")
    assert not too_new("GLIBC_2.17") and too_new("GLIBC_2.18")


@pytest.mark.skipif(shutil.which("musl-gcc") is None, reason="musl-gcc not installed (apt-get install -y musl-tools)")
def test_library_loads_under_musl_and_keeps_its_dlsym(build, tmp_path):
    program = tmp_path / "t_musl"
    source = REPO / "hook" / "tests" / "t_musl.c"
    subprocess.run(["musl-gcc", "-O2", "-rdynamic", "-o", str(program), str(source)], check=True)
    env = {"LD_LIBRARY_PATH": str(build / "sim"), "GPUSHARE_SIM_STATE": str(tmp_path / "sim.state"),
           "GPUSHARE_MEMORY_LIMIT_0": str(1 << 30)}
    plain = subprocess.run([str(program)], env=env, capture_output=True, text=True, timeout=60)
    hooked = subprocess.run([str(program)], env=dict(env, LD_PRELOAD=str(build / "libgpushare.so")),
                            capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and "OK t_musl" in plain.stdout, (plain.stdout, plain.stderr)
    assert hooked.returncode == 0 and hooked.stdout == plain.stdout, (hooked.stdout, hooked.stderr)
    # one line, at the first driver lookup, naming why
    assert hooked.stderr.count("gpushare: the claim's library is not active") == 1, hooked.stderr
    assert "not glibc" in hooked.stderr
