"""A rolling upgrade of the DaemonSet: the old plugin stops, install-hook installs a new library
build, the new plugin starts on the same state dir. Prepared claims stay prepared, and what
their containers see (spec, library build, limits, regions, control files) stays the same;
the old build is removed once the last claim on it is unprepared."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest

from dra_driver.install import install_versioned
from kubeletplugin import checkpoint as ckpt
from kubeletplugin.main import Plugin
from playground.claims import make_claim, result
from playground.kubelet import Kubelet
from tests.support.plugin import REAL_LIBRARY, plugin_config


def snapshot(dirs, uid: str) -> dict:
    """Every host file the claim's containers mount: path -> (inode, bytes); plus the spec.
    Control files by inode only: the node agent rewrites their rate (zero while it is stopped)."""
    with open(os.path.join(dirs.cdi, f"k8s.gpushare.dev-claim_{uid}.json")) as f:
        spec = json.load(f)
    files = {}
    for m in spec["containerEdits"]["mounts"]:
        with open(m["hostPath"], "rb") as f:
            control = m["containerPath"].startswith("/var/run/gpushare/control/")
            files[m["containerPath"]] = (os.fstat(f.fileno()).st_ino, None if control else f.read())
    return {"spec": spec, "files": files}


@pytest.fixture
def builds(tmp_path):
    """install(n) installs library build n into a host hook dir as install-hook does."""
    source, hook = tmp_path / "src" / "libgpushare.so", tmp_path / "hook"
    source.parent.mkdir()

    def install(n: int):
        if os.path.isfile(REAL_LIBRARY):
            shutil.copy(REAL_LIBRARY, source)
        else:
            source.write_bytes(b"stand-in library\n")
        with open(source, "ab") as f:
            f.write(b"\0build %d" % n)  # a different build: another content hash
        return install_versioned(source, hook, "libgpushare.so")

    install.dir = hook
    return install


def test_rolling_upgrade_keeps_prepared_claims(api, dirs, builds):
    def start() -> tuple[Plugin, Kubelet]:
        plugin = Plugin(plugin_config(dirs, str(builds.dir)), api=api).start()
        return plugin, Kubelet(dirs.dra_socket, dirs.reg_socket)

    old_build = builds(1)
    plugin, kubelet = start()
    try:
        claim = make_claim(api, [result("gpu-0", consumed={"memory": "2Gi", "compute": "40"})])
        uid = claim.uid
        first = kubelet.prepare(claim).claims[uid]
        assert first.error == ""
        region = os.path.join(dirs.state, "claims", uid, "region", "0")
        with open(region, "r+b") as f:  # usage a running container left in its region
            f.seek(4096)
            f.write(b"in use")
        before = snapshot(dirs, uid)
        assert before["spec"]["containerEdits"]["mounts"][0]["hostPath"] == str(old_build)
    finally:
        kubelet.close()
        plugin.stop(grace=1)

    new_build = builds(2)  # the new pod's init container
    assert old_build.exists() and os.path.realpath(builds.dir / "libgpushare.so") == str(new_build)
    plugin, kubelet = start()
    try:
        assert uid in plugin.driver.prepared_claims()
        after = snapshot(dirs, uid)
        assert after["spec"] == before["spec"]
        changed = [path for path in before["files"] if after["files"][path] != before["files"][path]]
        assert not changed  # same files: inodes and bytes
        again = kubelet.prepare(claim).claims[uid]  # a new pod of the same claim after the upgrade
        assert again.error == "" and list(again.devices) == list(first.devices)
        assert snapshot(dirs, uid) == before
        assert old_build.exists()  # still in use

        other = make_claim(api, [result("gpu-1", consumed={"memory": "1Gi", "compute": "10"})])
        assert kubelet.prepare(other).claims[other.uid].error == ""
        assert snapshot(dirs, other.uid)["spec"]["containerEdits"]["mounts"][0]["hostPath"] == str(new_build)

        assert kubelet.unprepare(claim).claims[uid].error == ""
        assert not old_build.exists()  # the last claim on the old build is gone
        assert new_build.exists()
    finally:
        kubelet.close()
        plugin.stop(grace=1)


def test_a_claim_recorded_without_its_library_keeps_the_build_its_spec_names(api, dirs, builds):
    """An older release recorded no library build: recovery reads it from the claim's spec once
    and records it, so the spec keeps naming that build after the upgrade."""
    old_build = builds(1)
    plugin = Plugin(plugin_config(dirs, str(builds.dir)), api=api).start()
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    claim = make_claim(api, [result("gpu-0", consumed={"memory": "2Gi", "compute": "40"})])
    assert kubelet.prepare(claim).claims[claim.uid].error == ""
    kubelet.close()
    plugin.stop(grace=1)
    path = os.path.join(dirs.state, "checkpoint.json")
    with open(path, "rb") as f:
        claims, boot = ckpt.decode(f.read())
    entry = claims[claim.uid]
    claims[claim.uid] = replace(entry, prepared=replace(entry.prepared, library=None))  # as the older release wrote it
    with open(path, "wb") as f:
        f.write(ckpt.encode(claims, boot))

    builds(2)
    plugin = Plugin(plugin_config(dirs, str(builds.dir)), api=api).start()
    try:
        assert plugin.driver.checkpoint.get(claim.uid).prepared.library == str(old_build)
        spec = snapshot(dirs, claim.uid)["spec"]
        assert spec["containerEdits"]["mounts"][0]["hostPath"] == str(old_build)
    finally:
        plugin.stop(grace=1)
