"""Run NVIDIA's MPS control program from the driver root, as NVIDIA's DRA driver does (its
mps-control-daemon template: `chroot /driver-root nvidia-cuda-mps-control -d`): the daemon, the
servers it starts and the command program all run on the driver root's own libraries, whatever
the plugin's image holds (docs/strategies.md, "On GPU nodes").

`python -m kubeletplugin.strategies.mps.root --root ROOT --gpu-dir DIR -- PROGRAM [ARGS]`, run by
kubeletplugin/strategies/mps/control.py as root in the plugin's (privileged) container:

1. a mount namespace of its own (private: nothing it mounts is seen by the plugin or the host),
   which the daemon keeps for its life;
2. a small tmpfs at ROOT/tmp (the driver root itself is mounted read-only and is never written)
   holding IN_ROOT, a bind of the GPU's folder (mpslayout: pipe, log, control), so the daemon's
   folders are the ones the plugin and the agent see and the claims' containers mount;
3. the plugin's /dev, /proc and /sys bound over ROOT's (the GPU's device nodes), then the GPU's
   shm folder over ROOT/dev/shm: one /dev/shm per daemon, the same folder its clients get at
   /dev/shm (cdispec.mps_edits), as an MPS server and its clients share memory there;
4. chroot(ROOT), then exec PROGRAM with the caller's environment (control.py names the folders by
   their IN_ROOT paths).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

IN_ROOT = "/tmp/gpushare-mps"  # the GPU's folders as the chrooted daemon sees them

_CLONE_NEWNS = 0x00020000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    if libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                  ctypes.c_ulong(flags), data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source or fstype} on {target}: {os.strerror(err)}")


def enter(root: str, gpu_dir: str) -> None:
    """Steps 1-4 but the exec: this process ends up chrooted into `root`."""
    libc = _libc()
    if libc.unshare(_CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)} (the plugin runs privileged)")
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    tmp = os.path.join(root, "tmp")
    _mount(libc, "tmpfs", tmp, "tmpfs", 0, "mode=0755,size=1m")
    inside = root + IN_ROOT
    os.makedirs(inside, mode=0o755)
    _mount(libc, gpu_dir, inside, None, _MS_BIND)  # one mount: the daemon renames from control/ into pipe/
    for name in ("dev", "proc", "sys"):
        if os.path.isdir(os.path.join(root, name)) and not os.path.samefile(os.path.join(root, name), f"/{name}"):
            _mount(libc, f"/{name}", os.path.join(root, name), None, _MS_BIND | _MS_REC)
    shm = os.path.join(gpu_dir, "shm")
    if os.path.isdir(shm) and os.path.isdir(os.path.join(root, "dev", "shm")):
        _mount(libc, shm, os.path.join(root, "dev", "shm"), None, _MS_BIND)
    os.chroot(root)
    os.chdir("/")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m kubeletplugin.strategies.mps.root")
    p.add_argument("--root", required=True)
    p.add_argument("--gpu-dir", required=True)
    p.add_argument("program", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        p.error("no program")
    try:
        enter(os.path.abspath(args.root), os.path.abspath(args.gpu_dir))
        os.execve(program[0], program, dict(os.environ))  # never returns
    except OSError as e:
        print(f"running {program[0]} in driver root {args.root}: {e}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
