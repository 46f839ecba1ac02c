"""A tenant "in a container" as far as files go: a root process in a mount namespace of its own
that sees a claim's CDI mounts at their container paths (under a view folder) with the spec's
options, so a read-only mount is read-only by the kernel's word, as runc makes it. Used to try
what a container could do to the node's MPS control daemon (tests/agent/test_mps_daemon_attacks.py).

Only the mounts are a container's: the process still sees the host's other files, so an attack
must use the view's paths only, as a real container's process could."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from playground.containers import spec_edits

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
