"""A tenant "in a container" as far as files go: a root process in a mount namespace of its own
that sees a claim's CDI mounts at their container paths (under a view folder) with the spec's
options, so a read-only mount is read-only by the kernel's word, as runc makes it. Used to try
what a container could do to the node's MPS control daemon (tests/agent/test_mps_daemon_attacks.py).

Only the mounts are a container's: the process still sees the host's other files, so an attack
must use the view's paths only, as a real container's process could.

Also the image of a tenant that bypasses the library (private_loader_runner), for real podman
containers (tests/agent/test_backstop_podman.py, test_compute_guard.py)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap

from playground.containers import PodmanRunner, spec_edits

from . import BUILD

# Runs in the new mount namespace: bind each mount at <view>/<containerPath> (read-only when the
# spec says so), then run the attack with VIEW set.
_BOOT = textwrap.dedent("""
    import json, os, subprocess, sys
    view, mounts, code = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    for m in mounts:
        target = view + m["containerPath"]
        if os.path.isdir(m["hostPath"]):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        subprocess.run(["mount", "--bind", m["hostPath"], target], check=True)
        if "ro" in (m.get("options") or []):
            subprocess.run(["mount", "-o", "remount,bind,ro", target], check=True)
    os.environ["VIEW"] = view
    exec(compile(code, "<tenant>", "exec"))
""")


def spec_mounts(cdi_root: str, device_ids: list[str]) -> list[dict]:
    """The mounts (with their options) of the CDI spec(s) defining these devices."""
    return [m for e in spec_edits(cdi_root, device_ids) for m in e.get("mounts") or []]


def start_tenant(cdi_root: str, device_ids: list[str], view: str, code: str,
                 only: tuple[str, ...] = ("/tmp/nvidia-mps", "/dev/shm")) -> subprocess.Popen[str]:
    """The attack `code` (Python, as root, VIEW = the container's /) in its own mount namespace
    with the claim's mounts under `only` (container paths); its stdout is a pipe."""
    mounts = [m for m in spec_mounts(cdi_root, device_ids)
              if any(m["containerPath"] == p or m["containerPath"].startswith(p + "/") for p in only)]
    os.makedirs(view, exist_ok=True)
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _BOOT, view,
                             json.dumps(mounts), code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_tenant(cdi_root: str, device_ids: list[str], view: str, code: str, timeout: float = 30) -> str:
    """start_tenant to its end; its output."""
    proc = start_tenant(cdi_root, device_ids, view, code)
    out, _ = proc.communicate(timeout=timeout)
    return out


PRIVATE_LOADER = "/lib64/ld-private.so"


def private_loader_runner():
    """A busybox image with the probe, whose /var/run is a link to /run (Debian, Ubuntu), and a
    private dynamic loader beside the real one: a copy of ld.so that reads another preload file
    than /etc/ld.so.preload, so a tenant running through it with LD_PRELOAD unset bypasses the
    library the way the library cannot stop. The caller closes it."""
    r = PodmanRunner(os.path.join(BUILD, "gpushare-probe"))
    var_run = os.path.join(r.rootfs, "var", "run")
    os.rmdir(var_run)
    os.makedirs(os.path.join(r.rootfs, "run"), exist_ok=True)
    os.symlink("../run", var_run)
    install_private_loader(r.rootfs)
    return r


def install_private_loader(rootfs: str) -> None:
    """PRIVATE_LOADER in the root: its ld.so, reading /etc/ld.so.nothing instead of /etc/ld.so.preload."""
    loader = glob.glob(os.path.join(rootfs, "lib*", "ld-linux*.so*"))[0]
    with open(loader, "rb") as f:
        data = f.read()
    assert b"/etc/ld.so.preload" in data
    target = os.path.join(rootfs, PRIVATE_LOADER.lstrip("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as f:
        f.write(data.replace(b"/etc/ld.so.preload", b"/etc/ld.so.nothing"))
    os.chmod(target, 0o755)
