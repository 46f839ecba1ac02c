"""Run the real kubectl in tests, only ever against a kubeconfig the test wrote itself.

Every call passes --kubeconfig and sets KUBECONFIG to that file, and HOME and the cache
folder point into the test's own folder, so no kubeconfig or cache of the machine is read.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")


class Kubectl:
    def __init__(self, workdir: Path, server: str = "http://127.0.0.1:1", kubeconfig=None):
        """kubeconfig: one the test had written (`gpushare-dra emulator --kubeconfig-out`);
        else one is written here naming server (the default is never reachable, for
        commands that must not talk to one, such as `kubectl kustomize`)."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if kubeconfig is None:
            kubeconfig = write_kubeconfig(self.workdir / "kubeconfig", server)
        self.kubeconfig = Path(kubeconfig)
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.workdir),
                    "KUBECONFIG": str(self.kubeconfig), "LANG": "C"}

    def command(self, *args) -> list[str]:
        return [KUBECTL, f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.workdir / 'cache'}",
                *map(str, args)]

    def popen(self, *args) -> subprocess.Popen:
        """kubectl ARGS running on (`get -w`), its stdout a text pipe."""
        return subprocess.Popen(self.command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self.env, cwd=self.workdir)

    def run(self, *args, input=None, check=True, timeout=60):
        """kubectl ARGS; returns the CompletedProcess (stdout and stderr as text)."""
        cmd = self.command(*args)
        out = subprocess.run(cmd, input=input, capture_output=True, text=True, env=self.env,
                             timeout=timeout, cwd=self.workdir)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[1:])} exited {out.returncode}:\n"
                                 f"{out.stdout}\n{out.stderr}")
        return out

    def __call__(self, *args, **kwargs) -> str:
        return self.run(*args, **kwargs).stdout

    def objects(self, *args) -> list[dict]:
        """The YAML documents kubectl ARGS prints."""
        return [d for d in yaml.safe_load_all(self(*args)) if d]


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}))
    return path
