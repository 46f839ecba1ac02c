"""The library under AddressSanitizer + UBSan, the region code under ThreadSanitizer and valgrind."""
import os
import shutil
import subprocess

import pytest

from tests.support import MiB
from tests.support.hook import HOOK, kv

LIMIT = 64 * MiB
ASAN_ENV = {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:verify_asan_link_order=0",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


def _libasan():
    path = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@pytest.fixture
def asan_claim(make_claim, asan_build):
    if not _libasan():
        pytest.skip("libasan not installed")
    c = make_claim(memory=LIMIT)
    c.env["LD_LIBRARY_PATH"] = str(asan_build / "sim")
    c.env.update(ASAN_ENV)
    return c


def _asan_run(c, asan_build, *args, **kw):
    # the sanitizer runtime must come first: the test programs themselves are instrumented
    env = {"LD_PRELOAD": f"{_libasan()} {asan_build / 'libgpushare.so'}"}
    p = c.run(*args, build=asan_build, preload=False, env=env, check=False, **kw)
    assert p.returncode == 0 and "ERROR: AddressSanitizer" not in p.stderr and "runtime error" not in p.stderr, \
        p.stdout + p.stderr
    return p


@pytest.mark.parametrize("args", [("tests/t_apis", LIMIT), ("tests/t_threads", LIMIT, MiB, 5),
                                  ("tests/t_fork", LIMIT), ("tests/t_race", 4, 10, LIMIT, 3 * MiB),
                                  ("tests/t_dlnext",), ("tests/t_paths", LIMIT)])
def test_asan_ubsan(asan_claim, asan_build, args):
    p = _asan_run(asan_claim, asan_build, *args, timeout=180)
    assert "OK " in p.stdout


def test_asan_probe_and_pacing(asan_claim, asan_build):
    out = kv(_asan_run(asan_claim, asan_build, "gpushare-probe", "alloc", "--chunk", "8Mi").stdout)
    assert int(out["allocated"]) == LIMIT
    asan_claim.limits.write_text(asan_claim.limits.read_text().replace("COMPUTE_LIMIT_0=100", "COMPUTE_LIMIT_0=40"))
    _asan_run(asan_claim, asan_build, "gpushare-probe", "launch", "--seconds", "0.5")


def test_tsan_region(tmp_path):
    try:
        subprocess.run(["make", "-s", "-C", str(HOOK), "tsan"], check=True, capture_output=True, timeout=300)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"ThreadSanitizer unavailable: {e.stderr[-300:]}")
    exe = HOOK / "build-tsan" / "tests" / "t_region"
    p = subprocess.run([str(exe), str(tmp_path)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, TSAN_OPTIONS="halt_on_error=1"))
    if "unexpected memory mapping" in p.stderr:  # kernels with high mmap ASLR entropy
        p = subprocess.run(["setarch", "-R", str(exe), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "WARNING: ThreadSanitizer" not in p.stderr, p.stdout + p.stderr[-3000:]
    assert "OK t_region" in p.stdout


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind not installed")
def test_valgrind_region_and_library(make_claim, build, tmp_path):
    vg = ["valgrind", "-q", "--error-exitcode=9", "--child-silent-after-fork=yes"]
    p = subprocess.run([*vg, str(build / "tests" / "t_region"), str(tmp_path)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "OK t_region" in p.stdout, p.stdout + p.stderr[-3000:]
    c = make_claim(memory=LIMIT)
    env = dict(c.env, LD_PRELOAD=str(build / "libgpushare.so"))
    p = subprocess.run([*vg, str(build / "tests" / "t_apis"), str(LIMIT)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "OK t_apis" in p.stdout, p.stdout + p.stderr[-3000:]
