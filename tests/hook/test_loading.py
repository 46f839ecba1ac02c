"""Preloaded into every process: nothing happens until the first CUDA or NVML call."""
import re
import shutil
import subprocess

import pytest

from tests.support.hook import kv


def _opened(cmd, env, tmp_path):
    log = tmp_path / "strace.log"
    subprocess.run(["strace", "-f", "-qq", "-o", str(log), "-e", "trace=open,openat,socket,clone,clone3,mmap",
                    *cmd], env=env, check=True, capture_output=True, timeout=60)
    text = log.read_text()
    opened = sorted(set(re.findall(r'open(?:at)?\([^"]*"([^"]+)"', text)))
    threads = len(re.findall(r"clone3?\(.*CLONE_THREAD", text))
    return opened, threads


@pytest.mark.skipif(not shutil.which("strace"), reason="strace not installed")
@pytest.mark.parametrize("cmd", [["/bin/true"], ["/bin/sh", "-c", "ls / >/dev/null"],
                                 ["python3", "-c", "import ctypes; ctypes.CDLL(None).printf"]])
def test_non_cuda_process_opens_nothing(make_claim, tmp_path, cmd):
    c = make_claim()
    lib = str(c.build / "libgpushare.so")
    plain, plain_threads = _opened(cmd, c.env, tmp_path)
    hooked, hooked_threads = _opened(cmd, dict(c.env, LD_PRELOAD=lib), tmp_path)
    # besides the library, the loader opens what it names as dependencies: libdl.so.2 and
    # libpthread.so.0, where glibc < 2.34 keeps dlopen and the robust mutexes (hook/src/baseline.h)
    extra = set(hooked) - set(plain) - {lib}
    assert lib in hooked and {p.rsplit("/", 1)[-1] for p in extra} <= {"libdl.so.2", "libpthread.so.0"}, \
        set(hooked) ^ set(plain)
    assert hooked_threads == plain_threads


def test_non_cuda_process_state(make_claim):
    c = make_claim()
    hooked = c.run("tests/t_noinit")
    plain = c.run("tests/t_noinit", preload=False)
    assert hooked.stdout == plain.stdout and hooked.stderr == "" , (hooked.stdout, plain.stdout)
    assert kv(hooked.stdout) == {"fds": kv(plain.stdout)["fds"], "threads": "1", "driver_or_region_mappings": "0"}


def test_no_constructor_and_only_hooks_exported(build):
    lib = build / "libgpushare.so"
    dyn = subprocess.run(["readelf", "-dW", str(lib)], capture_output=True, text=True, check=True).stdout
    # gcc's own frame_dummy is the one .init_array entry; a constructor of ours would add one
    size = re.search(r"\(INIT_ARRAYSZ\)\s+(\d+)", dyn)
    assert size is None or int(size.group(1)) <= 8, dyn
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    names = {ln.split()[-1] for ln in syms.splitlines() if ln.strip()}
    assert names and all(n.startswith(("cu", "nvml")) or n == "dlsym" for n in names), names


def test_dlsym_keeps_rtld_next_and_hooks_driver_handles(make_claim):
    c = make_claim()
    p = c.run("tests/t_dlnext")
    assert "OK t_dlnext" in p.stdout, p.stdout
