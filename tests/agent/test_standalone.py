"""A fresh clone is complete: nothing outside the repository is read or cited, and `make test`
installs what the container suites need as root, or says in one line what skips and why."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
OUTSIDE = os.path.join("..", "shared")  # built, so this file does not match itself
PACKAGES = ("podman", "runc", "busybox-static", "valgrind", "strace", "gcc", "make", "libc6-dev", "debootstrap", "musl",
            "musl-tools")


def tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        try:
            yield name, (ROOT / name).read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_file_reads_or_cites_a_path_outside_the_repository():
    offenders = [name for name, text in tracked_text_files() if OUTSIDE in text]
    assert not offenders


def test_the_cdi_schema_is_vendored_with_its_source_and_licence():
    folder = ROOT / "tests" / "support" / "cdi-schema"
    assert {p.name for p in folder.iterdir()} >= {"schema.json", "defs.json", "README.md", "LICENSE"}
    note = (folder / "README.md").read_text()
    assert "cncf-tags/container-device-interface" in note and "Apache License 2.0" in note
    assert "Apache License" in (folder / "LICENSE").read_text()


def test_ci_runs_the_readme_command():
    """.ci/run is `make test` (its status is CI's), which runs the two-node tests with the rest."""
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    assert script[-1] == "exec make test"
    readme = (ROOT / "README.md").read_text()
    assert "\nmake test " in readme
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\ntest:"):makefile.index("\ntest-two-nodes:")]
    assert "-m \"not two_nodes\"" not in recipe and " tests/cluster;" in recipe


def _test_deps(env_path: str, as_user: str | None = None):
    # The script comes on stdin: another user may not be able to open a file under a private clone.
    cmd = ["bash", "-s"]
    if as_user:
        cmd = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, input=(ROOT / "hack" / "test-deps").read_text(), capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PATH": env_path}, cwd="/")


def _fake_apt(tmp_path):
    """An apt-get that records being called: hack/test-deps must not call it needlessly."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/apt-called\nexit 1\n")
    (bin_dir / "apt-get").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_not_root_says_in_one_line_what_skips(tmp_path):
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("setpriv not installed: cannot drop to another user")
    res = _test_deps(_fake_apt(tmp_path), as_user="65534" if os.geteuid() == 0 else None)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "" and res.stdout.count("\n") == 1, res.stdout
    assert res.stdout.startswith("make test: not root, installing nothing; skipping "
                                 "tests/kubeletplugin/test_podman.py, tests/agent/test_image_matrix.py and "
                                 "tests/e2e (they run podman containers, which needs root)"), res.stdout
    assert not (tmp_path / "apt-called").exists()


def _installed(package):
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return "install ok installed" in out.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the install path runs as root")
def test_root_with_everything_installed_touches_no_apt(tmp_path):
    if not shutil.which("dpkg-query") or not all(_installed(p) for p in PACKAGES):
        pytest.skip("not every package is installed here (`make test` as root installs them first)")
    res = _test_deps(_fake_apt(tmp_path))
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    assert not (tmp_path / "apt-called").exists()
