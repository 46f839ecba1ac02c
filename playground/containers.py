"""Run programs "in a container" that was given CDI devices: the demo's and tests' workloads.

Two runners, one interface: `start(name, device_ids, argv) -> Workload` runs the probe,
`start_command(name, device_ids, argv, log=None)` any command (a pod's container), its output
read by `Workload.read_until` or, with `log`, written to that file (what `kubectl logs` reads);
both take `cgroup_parent` (`/kubepods/pod<uid>`: the cgroup the kubelet gives a pod, by which
the node agent finds a pod's processes):

- `PodmanRunner`: a real CDI consumer. podman + runc start a container on a small root
  filesystem (the probe, its libraries, busybox when present) with `--device` for each CDI
  device ID, so the runtime itself applies our spec: mounts, environment, ld.so.preload.
- `ProcessRunner`: no container runtime. It reads the same CDI spec and applies it to a
  host process: the environment as written, and each mount translated to its host path
  (the library finds its limits and regions through GPUSHARE_RUN_DIR, a folder laid out
  like the container's /var/run/gpushare). Used where podman is missing or not root. With
  `cgroup_parent` the process starts in `<cgroup_parent>/<name>` of one cgroup hierarchy (root
  only).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

# This sandbox (and some CI runners) refuse setrlimit: drop process.rlimits from the OCI
# bundle, then run the real runc. Harmless where setrlimit works.
_RUNC_WRAPPER = """#!{python}
import json, os, sys
args = sys.argv[1:]
if "--bundle" in args:
    path = os.path.join(args[args.index("--bundle") + 1], "config.json")
    with open(path) as f:
        config = json.load(f)
    config.get("process", {{}}).pop("rlimits", None)
    with open(path, "w") as f:
        json.dump(config, f)
os.execv({runc!r}, ["runc"] + args)
"""

_CONTAINERS_CONF = """[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[engine.runtimes]
runc = [{wrapper!r}]
"""

def podman_env(folder: str) -> dict[str, str]:
    """The environment for podman whose runc is the wrapper above (written into folder)."""
    wrapper = os.path.join(folder, "runc-wrapper")
    Path(wrapper).write_text(_RUNC_WRAPPER.format(python=sys.executable, runc=shutil.which("runc")))
    os.chmod(wrapper, 0o755)
    conf = os.path.join(folder, "containers.conf")
    Path(conf).write_text(_CONTAINERS_CONF.format(wrapper=wrapper))
    return {**os.environ, "CONTAINERS_CONF": conf}


# Where the probe lives inside containers.
CONTAINER_PROBE = "/usr/local/bin/gpushare-probe"


class Workload:
    """A running container's main process. A thread collects its stdout lines as they come."""

    def __init__(self, name: str, proc: subprocess.Popen[str], kill=None):
        self.name = name
        self.proc = proc
        self._kill = kill  # kills it from outside: a container's PID 1 ignores SIGTERM
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        if proc.stdout is not None:  # else its output goes to a log file
            threading.Thread(target=self._pump, name=f"workload-{name}", daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None  # started with stdout=PIPE
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)  # end of output

    def read_until(self, prefix: str, timeout: float = 60) -> dict[str, str]:
        """Read lines until one starts with `prefix`; return that line's key=value pairs."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if line.startswith(prefix):
                return parse_kv(line)
        raise RuntimeError(f"{self.name}: no line starting with {prefix!r}; output so far: {self.lines}; "
                           f"stderr: {self._stderr()}")

    def wait(self, timeout: float = 60) -> list[str]:
        """Wait for the process to end; all its output lines."""
        self.proc.wait(timeout=timeout)
        while (line := self._queue.get(timeout=timeout)) is not None:
            self.lines.append(line)
        return self.lines

    def stop(self) -> None:
        if self.proc.poll() is None:
            if self._kill:
                self._kill()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def running(self) -> bool:
        return self.proc.poll() is None

    def _stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read() if self.proc.stderr else ""


def spec_edits(cdi_root: str, device_ids: list[str]) -> list[dict]:
    """The containerEdits, spec-wide then the device's own, of the spec(s) in cdi_root that
    define these devices (`kind=name` CDI ids), in the order a runtime applies them."""
    out: list[dict] = []
    for device_id in device_ids:
        kind, _, name = device_id.partition("=")
        for path in Path(cdi_root).glob("*.json"):
            spec = json.loads(path.read_text())
            if spec.get("kind") != kind or name not in {d["name"] for d in spec.get("devices", [])}:
                continue
            out.append(spec.get("containerEdits") or {})
            out += [d.get("containerEdits") or {} for d in spec["devices"] if d["name"] == name]
    return out


def parse_kv(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def _start(name: str, cmd: list[str], env: dict[str, str], kill=None, log: str | None = None) -> Workload:
    if log is None:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    else:  # stdout and stderr interleaved in one file, as a container runtime's log
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
        if kill is None:  # a shell's children too, as stopping a container stops all its processes
            kill = lambda: _kill_group(proc.pid)  # noqa: E731
    return Workload(name, proc, kill)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class ProcessRunner:
    """Applies a claim's CDI spec to a host process (no container runtime needed)."""

    kind = "process"

    def __init__(self, cdi_root: str, probe: str, workdir: str, path: tuple[str, ...] = ()):
        """path: folders put first on the processes' PATH (the tools a container's image would have)."""
        self.cdi_root = cdi_root
        self.probe = probe
        self.workdir = workdir
        self.path = path
        self._cgroups: list[str] = []  # the containers' cgroups it made (cgroup_parent)

    def _spec_edits(self, device_ids: list[str]) -> tuple[list[str], dict[str, str]]:
        """(env, mounts containerPath -> hostPath) of the spec(s) that define these devices."""
        env: list[str] = []
        mounts: dict[str, str] = {}
        for e in spec_edits(self.cdi_root, device_ids):
            env += e.get("env") or []
            mounts.update({m["containerPath"]: m["hostPath"] for m in e.get("mounts") or []})
        return env, mounts

    def start(self, name: str, device_ids: list[str], argv: list[str], cgroup_parent: str | None = None) -> Workload:
        return self.start_command(name, device_ids, [self.probe, *argv], cgroup_parent=cgroup_parent)

    def start_command(self, name: str, device_ids: list[str], argv: list[str], log: str | None = None,
                      cgroup_parent: str | None = None) -> Workload:
        """argv as a host process with the devices' CDI edits; with cgroup_parent, in its cgroup
        `<cgroup_parent>/<name>` (entered before the exec, as a container runtime does)."""
        env_list, mounts = self._spec_edits(device_ids)
        env = {k: v for k, v in (item.split("=", 1) for item in env_list)}
        # The container's /var/run/gpushare, rebuilt from the spec's mounts.
        run_dir = os.path.join(self.workdir, f"view-{name}")
        shutil.rmtree(run_dir, ignore_errors=True)
        for container_path, host_path in mounts.items():
            if container_path.startswith("/var/run/gpushare/"):
                link = os.path.join(run_dir, container_path.removeprefix("/var/run/gpushare/"))
                os.makedirs(os.path.dirname(link), exist_ok=True)
                os.symlink(host_path, link)
        host = {**os.environ, **env, "GPUSHARE_RUN_DIR": run_dir}
        for var in ("LD_PRELOAD", "GPUSHARE_SIM_STATE", "CUDA_MPS_PIPE_DIRECTORY"):  # paths into mounts
            if env.get(var) in mounts:
                host[var] = mounts[env[var]]
        if "LD_LIBRARY_PATH" in env:
            sim_lib = mounts.get(env["LD_LIBRARY_PATH"] + "/libcuda.so.1")
            if sim_lib:
                host["LD_LIBRARY_PATH"] = os.path.dirname(sim_lib)
        if self.path:
            host["PATH"] = os.pathsep.join([*self.path, host.get("PATH", os.defpath)])
        if cgroup_parent:  # the shell moves itself, then becomes the command: no moment outside it
            procs = os.path.join(self._cgroup(cgroup_parent, name), "cgroup.procs")
            argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]
        return _start(name, argv, host, log=log)

    def _cgroup(self, parent: str, name: str) -> str:
        """<parent>/<name> made in the node's cgroup hierarchy (cgroup2 if mounted, else the v1
        pids hierarchy: no controller that would change how the process is scheduled)."""
        mount = cgroup_mount()
        if mount is None:
            raise RuntimeError("no cgroup hierarchy mounted to put the container's process in")
        leaf = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        path = os.path.join(mount, parent.strip("/"), leaf)
        os.makedirs(path, exist_ok=True)
        self._cgroups.append(path)
        return path

    def close(self) -> None:
        """Remove the cgroups it made once their processes are gone (a busy one is left)."""
        for path in reversed(self._cgroups):
            for folder in (path, os.path.dirname(path)):  # the container's, then its pod's when empty
                try:
                    os.rmdir(folder)
                except OSError:
                    pass
        self._cgroups.clear()


OWNER_LABEL = "gpushare.dev/owner"  # on every container a PodmanRunner starts


class PodmanRunner:
    """podman + runc with our CDI devices: the runtime applies the spec."""

    kind = "podman"
    CDI_ROOT = "/var/run/cdi"  # podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi

    @staticmethod
    def available() -> str | None:
        """None when podman can run here, else why not."""
        if os.geteuid() != 0:
            return "not root"
        for tool in ("podman", "runc"):
            if shutil.which(tool) is None:
                return f"{tool} not installed (apt-get install -y podman runc)"
        return None

    def __init__(self, probe: str | None = None, libraries: tuple[str, ...] = (), rootfs: str | None = None,
                 owner: str | None = None):
        """Containers on a root filesystem built here from the host's files (the probe, the
        libraries it needs, busybox), or on `rootfs`, a distribution's own, used as it is.
        Each container is labelled OWNER_LABEL=`owner` (default: this runner's own folder), so
        one user of podman on the host (a playground, the test suite) finds its own containers
        and never another's (`podman ps --filter label=gpushare.dev/owner=...`)."""
        why = self.available()
        if why:
            raise RuntimeError(f"podman runner unavailable: {why}")
        self.work = tempfile.mkdtemp(prefix="gspodman")
        self.owner = owner or self.work
        self.rootfs = rootfs or build_rootfs(os.path.join(self.work, "rootfs"), probe, libraries)
        self.env = podman_env(self.work)
        self._cgroup_parents: set[str] = set()  # podman makes them in every hierarchy and leaves them
        self._cgroups_above: set[str] = set()  # and the folders above them it made

    def command(self, device_ids: list[str], argv: list[str], name: str | None = None,
                cgroup_parent: str | None = None) -> list[str]:
        cmd = ["podman", "run", "--rm", "--network=none", "--runtime", "runc", "--label", f"{OWNER_LABEL}={self.owner}"]
        if name:
            cmd += ["--name", name]
        if cgroup_parent:  # e.g. /kubepods/pod<uid>: the cgroup the kubelet would give a pod
            cmd += ["--cgroup-parent", cgroup_parent]
        for device in device_ids:
            cmd += ["--device", device]
        return [*cmd, "--rootfs", self.rootfs, *argv]

    def start(self, name: str, device_ids: list[str], argv: list[str], cgroup_parent: str | None = None) -> Workload:
        return self.start_command(name, device_ids, [CONTAINER_PROBE, *argv], cgroup_parent=cgroup_parent)

    def start_command(self, name: str, device_ids: list[str], argv: list[str], log: str | None = None,
                      cgroup_parent: str | None = None) -> Workload:
        """Any command of the root filesystem (start() runs the probe)."""
        container = f"gpushare-{name}-{uuid.uuid4().hex[:8]}"
        if cgroup_parent:
            parent = cgroup_parent.strip("/")
            self._cgroup_parents.add(parent)
            # The folders above the parent that podman is about to make (kubepods of
            # /kubepods/pod<uid>): close removes them too, when nothing else is in them.
            parts = parent.split("/")
            self._cgroups_above |= {"/".join(parts[:i]) for i in range(1, len(parts))
                                    for _, _, mount in _cgroup_mounts()
                                    if not os.path.isdir(os.path.join(mount, *parts[:i]))}
        return _start(name, self.command(device_ids, argv, name=container, cgroup_parent=cgroup_parent), self.env,
                      kill=lambda: subprocess.run(["podman", "kill", container], env=self.env, capture_output=True,
                                                  timeout=60), log=log)

    def run(self, device_ids: list[str], argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(device_ids, argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def close(self) -> None:
        """Remove its containers (a run that failed halfway, podman's own errors included, leaves
        them running: `--rm` removes only those that end), its folder and its cgroups."""
        left = subprocess.run(["podman", "ps", "-aq", "--filter", f"label={OWNER_LABEL}={self.owner}"],
                              env=self.env, capture_output=True, text=True, timeout=60).stdout.split()
        if left:
            subprocess.run(["podman", "rm", "-f", "-t", "0", *left], env=self.env, capture_output=True, timeout=120)
        shutil.rmtree(self.work, ignore_errors=True)
        deadline = time.monotonic() + 2  # a container just killed: its conmon ends a moment later
        for parent in self._cgroup_parents:
            for _, _, mount in _cgroup_mounts():
                for folder in ("conmon", ""):  # podman's monitor's, under the parent in cgroup v1
                    path = os.path.join(mount, parent, folder)
                    while os.path.isdir(path):
                        try:
                            os.rmdir(path)
                        except OSError:  # busy: still a process in it, or a folder podman has not removed
                            if time.monotonic() > deadline:
                                break
                            time.sleep(0.05)
        for above in sorted(self._cgroups_above, key=lambda p: p.count("/"), reverse=True):
            for _, _, mount in _cgroup_mounts():
                with contextlib.suppress(OSError):  # in use: another runner's or a kubelet's
                    os.rmdir(os.path.join(mount, above))
        self._cgroup_parents.clear()
        self._cgroups_above.clear()


def _cgroup_mounts() -> list[tuple[str, list[str], str]]:
    """(cgroup or cgroup2, super options, mount point) of each cgroup hierarchy mounted at its root,
    from /proc/self/mountinfo."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields, _, rest = line.partition(" - ")
                parts, (fstype, _source, options) = fields.split(), rest.split()[:3]
                if parts[3] == "/" and fstype in ("cgroup", "cgroup2"):
                    found.append((fstype, options.split(","), parts[4]))
    except OSError:
        pass
    return found


def cgroup_mount() -> str | None:
    """Where to make a container's cgroup: the cgroup2 hierarchy, else the v1 one with the pids
    controller; None without either."""
    mounts = _cgroup_mounts()
    return next((m for t, _, m in mounts if t == "cgroup2"), None) or \
        next((m for t, options, m in mounts if t == "cgroup" and "pids" in options), None)


def build_rootfs(rootfs: str, probe: str | None, libraries: tuple[str, ...]) -> str:
    """A root filesystem with busybox, the probe if given, and the shared libraries they need."""
    for d in ("bin", "etc", "proc", "sys", "dev", "tmp", "var/run", "usr/local/bin"):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    if probe:
        shutil.copy(probe, os.path.join(rootfs, CONTAINER_PROBE.lstrip("/")))
    for dep in _shared_deps([p for p in (probe, *libraries) if p]):
        target = os.path.join(rootfs, dep.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy(dep, target)
    busybox = shutil.which("busybox")
    if busybox:  # a shell and tools for scripted checks inside the container
        shutil.copy(busybox, os.path.join(rootfs, "bin", "busybox"))
        for tool in ("sh", "cat", "env", "stat", "grep", "sort", "echo", "sleep"):
            os.symlink("busybox", os.path.join(rootfs, "bin", tool))
    return rootfs


def _shared_deps(binaries: list[str]) -> set[str]:
    """Absolute paths of the shared libraries (and the loader) these binaries load."""
    deps: set[str] = set()
    for binary in binaries:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        for line in out.splitlines():
            path = line.split("=>")[-1].split("(")[0].strip()
            if path.startswith("/") and os.path.exists(path):
                deps.add(path)
    return deps
