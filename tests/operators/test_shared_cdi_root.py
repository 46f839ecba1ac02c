"""Two kubelet plugins on one host that share a CDI root (a playground and the test suite, two
playgrounds, a playground beside a real plugin: podman 4.3 reads specs only from /etc/cdi and
/var/run/cdi) never remove each other's specs: start-up recovery removes only the specs no claim
owns that this plugin wrote (they mount its own claims folder). And the playground's podman
containers carry their owner's label, so one user's leak check never counts another's."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile

import pytest

from kubeletplugin.claimfiles import unmount_all_regions
from playground.claims import make_claim, result
from playground.containers import OWNER_LABEL, PodmanRunner
from playground.kubelet import Kubelet
from tests.support import BUILD, podman_busybox_why_not, wait_for
from tests.support.plugin import Dirs, launch_plugin


def prepare_one(api, dirs: Dirs, hook_dir: str, cdi_root: str) -> str:
    """A plugin on `dirs` prepares one claim, and stops (its spec stays, as across a restart)."""
    plugin = launch_plugin(api, dirs, hook_dir, cdi_root)
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    try:
        claim = make_claim(api, [result("gpu-0-share-0")])
        assert kubelet.prepare(claim).claims[claim.uid].error == ""
        return claim.uid
    finally:
        kubelet.close()
        plugin.stop(grace=1)


def spec(cdi_root: str, uid: str) -> str:
    return os.path.join(cdi_root, f"k8s.gpushare.dev-claim_{uid}.json")


def test_a_plugin_leaves_another_plugins_specs_alone(api, hook_dir):
    roots = [tempfile.mkdtemp(prefix="gsshared") for _ in range(3)]
    cdi_root, a, b = roots[0], Dirs(roots[1]), Dirs(roots[2])
    try:
        theirs = prepare_one(api, a, hook_dir, cdi_root)
        mine = prepare_one(api, b, hook_dir, cdi_root)
        # b's state is lost (its spec is now an orphan of b's); a's claim is still prepared on a
        unmount_all_regions(b.state)
        shutil.rmtree(b.state)
        launch_plugin(api, b, hook_dir, cdi_root).stop(grace=1)
        assert not os.path.exists(spec(cdi_root, mine))  # b's own orphan: removed
        assert os.path.exists(spec(cdi_root, theirs))  # a's: untouched
        launch_plugin(api, a, hook_dir, cdi_root).stop(grace=1)
        assert os.path.exists(spec(cdi_root, theirs))  # and still a's after a's own restart
    finally:
        for root in roots:
            unmount_all_regions(Dirs(root).state)
            shutil.rmtree(root, ignore_errors=True)


def test_podman_containers_carry_their_owners_label():
    runner = object.__new__(PodmanRunner)  # the command only: podman need not be here
    runner.owner, runner.rootfs = "/tmp/playground-a", "/tmp/rootfs"
    command = runner.command(["k8s.gpushare.dev/claim=x"], ["true"])
    assert command[command.index("--label") + 1] == f"{OWNER_LABEL}=/tmp/playground-a"


def test_closing_a_runner_removes_its_containers_that_still_run_and_no_others():
    """A demo or test that fails halfway (podman's own errors included) leaves containers running
    (`--rm` removes only those that end): its runner's close removes its own, by its label."""
    if why := podman_busybox_why_not():
        pytest.skip(why)
    probe = os.path.join(BUILD, "gpushare-probe")
    mine, other = PodmanRunner(probe), PodmanRunner(probe)
    try:
        for r in (mine, other):
            r.start_command("sleeper", [], ["/bin/sh", "-c", "sleep 600"])

        def running(r: PodmanRunner) -> list[str]:
            return subprocess.run(["podman", "ps", "-q", "--filter", f"label={OWNER_LABEL}={r.owner}"],
                                  capture_output=True, text=True, check=True).stdout.split()

        assert wait_for(lambda: running(mine) and running(other), timeout=60)
        mine.close()
        assert not subprocess.run(["podman", "ps", "-aq", "--filter", f"label={OWNER_LABEL}={mine.owner}"],
                                  capture_output=True, text=True, check=True).stdout.split()
        assert running(other)
    finally:
        mine.close()
        other.close()


def test_closing_a_runner_removes_the_cgroups_podman_made_for_its_parents_and_no_others():
    """A container with --cgroup-parent /<top>/pod<uid> (the kubelet's layout, as the backstop
    tests run them): podman makes <top> in every hierarchy and leaves it (a `kubepods` in each was
    left after `make test`). close removes the folders it made; one that was there before stays."""
    if why := podman_busybox_why_not():
        pytest.skip(why)
    from playground.containers import _cgroup_mounts

    mounts = [m for _, _, m in _cgroup_mounts()]
    made, kept = f"gstest-{os.getpid()}-made", f"gstest-{os.getpid()}-kept"
    for m in mounts:
        os.mkdir(os.path.join(m, kept))
    runner = PodmanRunner(os.path.join(BUILD, "gpushare-probe"))
    try:
        for top in (made, kept):
            w = runner.start_command("sleeper", [], ["/bin/sh", "-c", "echo up; sleep 600"],
                                     cgroup_parent=f"/{top}/pod1")
            w.read_until("up", timeout=60)
        assert all(os.path.isdir(os.path.join(m, made, "pod1")) for m in mounts)
        runner.close()
        assert [m for m in mounts if os.path.exists(os.path.join(m, made))] == []
        assert [m for m in mounts if not os.path.isdir(os.path.join(m, kept))] == []
    finally:
        runner.close()
        for m in mounts:
            for folder in (f"{made}/pod1/conmon", f"{made}/pod1", made, f"{kept}/pod1/conmon", f"{kept}/pod1", kept):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(m, folder))
