"""Other software on the host, planted so that the suite and hack/cluster-down show they touch
only what they made: on a shared machine a GPU vendor's CDI specs, a gpushare spec of another run,
another kubelet's kubepods cgroup with a process in it and a podman container of another owner
are there before the tests start and must be there, unchanged, after.

`Neighbours(tag).plant()` makes them, `missing()` names what of them is gone or changed,
`remove()` takes them away (and the folders it had to make, when nothing else is in them).
Root only (CDI folders, cgroups, podman): `why_not()` says why not.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from playground.containers import OWNER_LABEL, PodmanRunner, cgroup_mount

CDI_DIRS = ("/etc/cdi", "/var/run/cdi")  # where podman, containerd and the plugin read specs
ONE_DAY = 86400


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "planting other software's CDI specs and cgroups needs root"
    if cgroup_mount() is None:
        return "no cgroup hierarchy to plant a process in"
    return None


def _spec(kind: str, device: str, mounts: list[dict] | None = None) -> dict:
    return {"cdiVersion": "0.6.0", "kind": kind,
            "devices": [{"name": device, "containerEdits": {"env": [f"NEIGHBOUR={device}"]}}],
            "containerEdits": {"mounts": mounts or []}}


class Neighbours:
    """What other software leaves on a host, tagged `tag` (unique per plant)."""

    def __init__(self, tag: str):
        self.tag = tag
        self.files: dict[str, bytes] = {}  # path -> content, as planted
        self.made_dirs: list[str] = []
        self.cgroup: str | None = None
        self.process: subprocess.Popen | None = None
        self.runner: PodmanRunner | None = None
        self.container: str | None = None

    # --- planting
    def plant(self, podman: bool = True) -> Neighbours:
        """Two specs in each CDI folder (another vendor's; a day-old gpushare spec of another run,
        a podman test's or playground's, mounting its own state dir), a process in kubepods/<tag>
        of the node's cgroup hierarchy, and (podman) a running container of another owner."""
        for folder in CDI_DIRS:
            self.spec(folder)
            uid = str(uuid.uuid4())
            old = self._write(os.path.join(folder, f"k8s.gpushare.dev-claim_{uid}.json"), _spec(
                "k8s.gpushare.dev/claim", f"{uid}-{self.tag}",
                [{"hostPath": f"/tmp/gskp-{self.tag}/state/claims/{uid}/limits",
                  "containerPath": "/var/run/gpushare/limits", "options": ["ro", "bind"]}]))
            os.utime(old, (time.time() - ONE_DAY,) * 2)
        self._start_process()
        if podman and PodmanRunner.available() is None:
            self._start_container()
        return self

    def spec(self, folder: str) -> str:
        """Another vendor's spec in folder (made if absent); written any time, e.g. while a cluster runs."""
        name = f"example.com-gpu_{self.tag}-{len(self.files)}.json"
        return self._write(os.path.join(folder, name), _spec("example.com/gpu", f"gpu-{self.tag}-{len(self.files)}"))

    def _write(self, path: str, doc: dict) -> str:
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            os.makedirs(folder)
            self.made_dirs.append(folder)
        data = json.dumps(doc, indent=2).encode()
        Path(path).write_bytes(data)
        self.files[path] = data
        return path

    def _start_process(self) -> None:
        mount = cgroup_mount()
        assert mount is not None
        kubepods = os.path.join(mount, "kubepods")
        if not os.path.isdir(kubepods):
            os.mkdir(kubepods)
            self.made_dirs.append(kubepods)
        self.cgroup = os.path.join(kubepods, f"neighbour-{self.tag}")
        os.mkdir(self.cgroup)
        # The shell moves itself into the cgroup, then becomes the sleep: never a moment outside it.
        self.process = subprocess.Popen(
            ["/bin/sh", "-c", 'echo $$ > "$0" && exec sleep 86400', os.path.join(self.cgroup, "cgroup.procs")],
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while str(self.process.pid) not in Path(self.cgroup, "cgroup.procs").read_text().split():
            assert time.monotonic() < deadline and self.process.poll() is None, "the neighbour's process did not start"
            time.sleep(0.02)

    def _start_container(self) -> None:
        self.runner = PodmanRunner(owner=f"neighbour-{self.tag}")
        self.container = f"neighbour-{self.tag}"
        cmd = ["podman", "run", "-d", "--network=none", "--runtime", "runc", "--name", self.container,
               "--label", f"{OWNER_LABEL}={self.runner.owner}", "--rootfs", self.runner.rootfs, "sleep", "86400"]
        out = subprocess.run(cmd, env=self.runner.env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"podman run of the neighbour's container: {out.stderr}"

    # --- checking
    def missing(self) -> list[str]:
        """What of the plant is gone or changed (empty: all there as planted)."""
        gone = []
        for path, data in self.files.items():
            try:
                if Path(path).read_bytes() != data:
                    gone.append(f"{path} (changed)")
            except FileNotFoundError:
                gone.append(f"{path} (removed)")
        if self.process is not None:
            if self.process.poll() is not None:
                gone.append(f"process {self.process.pid} in {self.cgroup} (exited {self.process.returncode})")
            elif self.cgroup and str(self.process.pid) not in Path(self.cgroup, "cgroup.procs").read_text().split():
                gone.append(f"process {self.process.pid} (no longer in {self.cgroup})")
        if self.container:
            assert self.runner is not None
            state = subprocess.run(["podman", "inspect", "-f", "{{.State.Status}}", self.container],
                                   env=self.runner.env, capture_output=True, text=True, timeout=60)
            if state.stdout.strip() != "running":
                gone.append(f"podman container {self.container} ({state.stdout.strip() or state.stderr.strip()})")
        return gone

    # --- removing
    def remove(self) -> None:
        for path in self.files:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if self.process is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        if self.runner is not None:
            self.runner.close()
        for folder in [self.cgroup, *reversed(self.made_dirs)]:
            if folder:
                _rmdir_when_empty(folder)


def _rmdir_when_empty(folder: str) -> None:
    """rmdir, retried for a moment (a cgroup whose process is still exiting is busy); a folder
    something else has put files in stays."""
    deadline = time.monotonic() + 2
    while os.path.isdir(folder):
        try:
            os.rmdir(folder)
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
