"""Restarts: the checkpoint is recovered before the sockets open."""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
from dataclasses import replace

import pytest

from kubeletplugin import checkpoint as ckpt
from kubeletplugin.agent.shares import PERIOD_US
from kubeletplugin.claimfiles import unmount_regions
from kubeletplugin.claimref import ClaimRef
from kubeletplugin.hooklayout import CONTROL, CONTROL_SIZE, REGION_SIZE
from playground.claims import make_claim, result
from playground.kubelet import Kubelet
from tests.support.cdi import duplicate_devices, load_spec, spec_path

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


@pytest.fixture
def prepared(api, start_plugin, dirs):
    """A running plugin with one prepared claim; returns (plugin, kubelet, claim, answer)."""
    plugin = start_plugin()
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    claim = make_claim(api, [result("gpu-1-share-0")])
    answer = kubelet.prepare(claim)
    assert answer.claims[claim.uid].error == ""
    yield plugin, kubelet, claim, answer
    kubelet.close()


def region(dirs, uid):
    return os.path.join(dirs.state, "claims", uid, "region", "0")


def edit_checkpoint(dirs, change):
    path = os.path.join(dirs.state, "checkpoint.json")
    with open(path, "rb") as f:
        claims, boot = ckpt.decode(f.read())
    boot = change(claims, boot) or boot
    with open(path, "wb") as f:
        f.write(ckpt.encode(claims, boot))


def test_checkpoint_file_is_versioned_and_checksummed(prepared, dirs):
    plugin, _, claim, _ = prepared
    # While the plugin runs, a Prepare appends to the journal: checksummed lines, the last one final.
    with open(os.path.join(dirs.state, "checkpoint.json.journal")) as f:
        lines = [json.loads(line) for line in f]
    assert [(line["uid"], line["entry"]["state"]) for line in lines] == [
        (claim.uid, ckpt.PREPARE_STARTED), (claim.uid, ckpt.PREPARE_COMPLETED)]
    assert all(line["checksum"].startswith("sha256:") for line in lines)
    # Stopping compacts it into the file (what an older release reads).
    plugin.stop(grace=1)
    with open(os.path.join(dirs.state, "checkpoint.json")) as f:
        doc = json.load(f)
    assert doc["version"] == 2 and doc["checksum"].startswith("sha256:")
    (entry,) = doc["claims"].values()
    assert entry["state"] == ckpt.PREPARE_COMPLETED
    assert os.path.getsize(os.path.join(dirs.state, "checkpoint.json.journal")) == 0
    for name in ("checkpoint.json", "checkpoint.json.journal"):
        assert os.stat(os.path.join(dirs.state, name)).st_mode & 0o777 == 0o600


def test_missing_spec_is_rewritten_at_start(prepared, start_plugin, dirs):
    plugin, kubelet, claim, answer = prepared
    before = load_spec(dirs, claim.uid)
    with open(region(dirs, claim.uid), "r+b") as f:
        f.write(b"usage")
    plugin.stop(grace=1)
    os.unlink(spec_path(dirs, claim.uid))  # a reboot empties /var/run/cdi
    start_plugin()
    assert load_spec(dirs, claim.uid) == before
    with open(region(dirs, claim.uid), "rb") as f:
        assert f.read(5) == b"usage"
    assert kubelet.prepare(claim) == answer


def test_prepare_started_is_rolled_back(prepared, start_plugin, dirs):
    plugin, kubelet, claim, _ = prepared
    plugin.stop(grace=1)

    def interrupt(claims, boot):
        claims[claim.uid] = replace(claims[claim.uid], state=ckpt.PREPARE_STARTED, prepared=None)

    edit_checkpoint(dirs, interrupt)
    plugin = start_plugin()
    assert not os.path.exists(spec_path(dirs, claim.uid))
    assert not os.path.exists(os.path.join(dirs.state, "claims", claim.uid))
    assert plugin.driver.checkpoint.get(claim.uid) is None
    # The kubelet retries: prepared once, from scratch.
    assert kubelet.prepare(claim).claims[claim.uid].error == ""
    assert set(plugin.driver.prepared_claims()) == {claim.uid}


def test_unprepare_started_is_finished(prepared, start_plugin, dirs):
    plugin, kubelet, claim, _ = prepared
    plugin.stop(grace=1)
    edit_checkpoint(dirs, lambda claims, boot: claims.update({claim.uid: replace(claims[claim.uid],
                                                                                state=ckpt.UNPREPARE_STARTED)}))
    plugin = start_plugin()
    assert os.listdir(dirs.cdi) == [] and os.listdir(os.path.join(dirs.state, "claims")) == []
    assert kubelet.unprepare(claim).claims[claim.uid].error == ""


def test_corrupt_checkpoint_is_moved_aside_and_rebuilt(api, prepared, start_plugin, dirs):
    plugin, kubelet, claim, answer = prepared
    orphan = make_claim(api, [result("gpu-0-share-0")])
    kubelet.prepare(orphan)
    plugin.stop(grace=1)
    unmount_regions(os.path.join(dirs.state, "claims", orphan.uid))
    shutil.rmtree(os.path.join(dirs.state, "claims", orphan.uid))  # only its spec is left: an orphan
    path = os.path.join(dirs.state, "checkpoint.json")
    with open(path, "r+b") as f:
        f.seek(40)
        f.write(b"garbage")
    plugin = start_plugin()
    asides = glob.glob(path + ".corrupt-*")  # the file and its journal, side by side
    assert len(asides) == 2 and sum(a.endswith(".journal") for a in asides) == 1
    assert set(plugin.driver.prepared_claims()) == {claim.uid}
    assert kubelet.prepare(claim) == answer
    assert not os.path.exists(spec_path(dirs, orphan.uid))
    with open(path, "rb") as f:
        claims, _ = ckpt.decode(f.read())
    assert set(claims) == {claim.uid}


def test_v1_checkpoint_is_migrated(start_plugin, dirs, hook_dir):
    os.makedirs(dirs.state)
    shutil.copy(os.path.join(FIXTURES, "checkpoint-v1.json"), os.path.join(dirs.state, "checkpoint.json"))
    uid = "6b1e3c2a-9f0d-4e5b-8a7c-1d2e3f405162"
    plugin = start_plugin()
    assert set(plugin.driver.prepared_claims()) == {uid}
    spec = load_spec(dirs, uid)
    assert spec["devices"][0]["name"] == f"{uid}-gpu-0-share-0"
    with open(os.path.join(dirs.state, "claims", uid, "limits")) as f:
        assert "GPUSHARE_MEMORY_LIMIT_0=2147483648\n" in f.read()
    with open(os.path.join(dirs.state, "checkpoint.json")) as f:
        assert json.load(f)["version"] == 2
    kubelet = Kubelet(dirs.dra_socket, dirs.reg_socket)
    assert kubelet.unprepare(ClaimRef("default", "legacy-claim", uid)).claims[uid].error == ""
    assert os.listdir(dirs.cdi) == []
    kubelet.close()


def test_reboot_zeroes_regions_but_keeps_claims(prepared, start_plugin, dirs):
    plugin, kubelet, claim, answer = prepared
    control = os.path.join(dirs.state, "claims", claim.uid, "control-0")
    for path in (region(dirs, claim.uid), control):
        with open(path, "r+b") as f:
            f.write(b"stale usage or rate from before the reboot")
    plugin.stop(grace=1)
    edit_checkpoint(dirs, lambda claims, boot: "an-earlier-boot")
    start_plugin()
    with open(region(dirs, claim.uid), "rb") as f:
        assert f.read() == bytes(REGION_SIZE)
    with open(control, "rb") as f:  # nothing stale; the agent may have written header, rate and slot again
        data = f.read()
    rate, end = CONTROL["rate_ppm"].offset, CONTROL["period_us"].offset + CONTROL["period_us"].size
    assert data[end:] == bytes(CONTROL_SIZE - end) and data[:8] in (bytes(8), b"GSCTRL01"), data[:32]
    if data[:8] == bytes(8) or CONTROL["rate_ppm"].read(data) == 0:  # zeroed; or opened by the agent, whose
        assert data[rate:end] == bytes(end - rate), data[:32]      # first period has not written it yet
    else:  # written again by the agent: a rate and a slot of its period (a time-sliced GPU's)
        assert CONTROL["period_us"].read(data) == PERIOD_US, data[:32]
    assert kubelet.prepare(claim) == answer


def test_checksum_mismatch_is_detected():
    data = ckpt.encode({}, "boot")
    doc = json.loads(data)
    doc["bootID"] = "tampered"
    with pytest.raises(ckpt.CheckpointCorrupt, match="checksum"):
        ckpt.decode(json.dumps(doc).encode())
    with pytest.raises(ckpt.CheckpointCorrupt, match="version"):
        payload = {"version": 99, "claims": {}}
        ckpt.decode(json.dumps({**payload, "checksum": ckpt.checksum(payload)}).encode())


def write_usage(dirs, uid, data=b"usage of running pods"):
    with open(region(dirs, uid), "r+b") as f:
        f.write(data)


def read_usage(dirs, uid, size=21):
    with open(region(dirs, uid), "rb") as f:
        return f.read(size)


def test_missing_checkpoint_is_rebuilt_from_the_claim_folders(prepared, start_plugin, dirs):
    """The issue's attack: with checkpoint.json deleted, a restart wiped every prepared claim."""
    plugin, kubelet, claim, answer = prepared
    before = load_spec(dirs, claim.uid)
    write_usage(dirs, claim.uid)
    plugin.stop(grace=1)
    os.unlink(os.path.join(dirs.state, "checkpoint.json"))
    plugin = start_plugin()
    assert set(plugin.driver.prepared_claims()) == {claim.uid}
    assert load_spec(dirs, claim.uid) == before
    # The next Prepare (a new pod of the claim) gets the same answer and the same region:
    # pods before and after the restart share one budget.
    assert kubelet.prepare(claim) == answer
    assert read_usage(dirs, claim.uid) == b"usage of running pods"
    with open(os.path.join(dirs.state, "checkpoint.json"), "rb") as f:
        assert set(ckpt.decode(f.read())[0]) == {claim.uid}
    assert kubelet.unprepare(claim).claims[claim.uid].error == ""
    assert os.listdir(dirs.cdi) == [] and os.listdir(os.path.join(dirs.state, "claims")) == []


def test_claim_missing_from_an_older_checkpoint_is_adopted(api, prepared, start_plugin, dirs):
    plugin, kubelet, claim, answer = prepared
    path = os.path.join(dirs.state, "checkpoint.json")
    with open(path, "rb") as f:
        older = f.read()  # a backup taken before the second claim
    second = make_claim(api, [result("gpu-2-share-3")])
    second_answer = kubelet.prepare(second)
    write_usage(dirs, second.uid)
    plugin.stop(grace=1)
    with open(path, "wb") as f:
        f.write(older)
    plugin = start_plugin()
    assert set(plugin.driver.prepared_claims()) == {claim.uid, second.uid}
    assert kubelet.prepare(second) == second_answer and kubelet.prepare(claim) == answer
    assert read_usage(dirs, second.uid) == b"usage of running pods"


def test_lost_files_are_rewritten_and_the_region_kept(prepared, start_plugin, dirs):
    plugin, kubelet, claim, answer = prepared
    folder = os.path.join(dirs.state, "claims", claim.uid)
    write_usage(dirs, claim.uid)
    plugin.stop(grace=1)
    for name in ("limits", "prepared.json", "control-0"):
        os.unlink(os.path.join(folder, name))
    os.chmod(folder, 0o711)  # as an older release made it
    start_plugin()
    assert sorted(os.listdir(folder)) == ["control-0", "ld.so.preload", "limits", "prepared.json", "region"]
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert read_usage(dirs, claim.uid) == b"usage of running pods"
    assert kubelet.prepare(claim) == answer


def test_folder_without_any_record_is_kept_and_reused_by_the_next_prepare(prepared, start_plugin, dirs):
    """Checkpoint and prepared.json both gone: nothing says what was prepared, but the region
    may be in use, so the folder stays; the claim's next Prepare reuses it."""
    plugin, kubelet, claim, answer = prepared
    write_usage(dirs, claim.uid)
    plugin.stop(grace=1)
    os.unlink(os.path.join(dirs.state, "checkpoint.json"))
    os.unlink(os.path.join(dirs.state, "claims", claim.uid, "prepared.json"))
    plugin = start_plugin()
    assert set(plugin.driver.prepared_claims()) == set()
    assert os.path.exists(region(dirs, claim.uid)) and os.path.exists(spec_path(dirs, claim.uid))
    assert kubelet.prepare(claim) == answer
    assert read_usage(dirs, claim.uid) == b"usage of running pods"
    assert kubelet.unprepare(claim).claims[claim.uid].error == ""
    assert os.listdir(dirs.cdi) == [] and os.listdir(os.path.join(dirs.state, "claims")) == []


def test_temporary_files_of_interrupted_writes_are_removed_at_start(prepared, start_plugin, dirs):
    plugin, kubelet, claim, answer = prepared
    plugin.stop(grace=1)
    spec_name = os.path.basename(spec_path(dirs, claim.uid))
    ours = [os.path.join(dirs.cdi, f".{spec_name}.a1b2c3d4.tmp"),
            os.path.join(dirs.cdi, f".tmp-a1b2c3d4-{spec_name}"),  # an older release's name, ends in .json
            os.path.join(dirs.state, ".checkpoint.json.a1b2c3d4.tmp"),
            os.path.join(dirs.state, "claims", claim.uid, ".limits.a1b2c3d4.tmp")]
    theirs = os.path.join(dirs.cdi, ".nvidia.yaml.a1b2c3d4.tmp")  # another vendor's: not ours to remove
    for path in [*ours, theirs]:
        with open(path, "wb") as f:
            f.write(b"{}")
    start_plugin()
    assert [p for p in ours if os.path.exists(p)] == []
    assert os.path.exists(theirs)
    assert kubelet.prepare(claim) == answer


def test_temporary_names_are_never_loaded_as_cdi_specs(tmp_path, monkeypatch):
    """A write cut short leaves `.<target>.<random>.tmp`: no .json/.yaml suffix, which CDI
    loaders (container-device-interface scanSpecDirs: podman, containerd) require."""
    from cdi import atomic

    seen = []
    real_rename = os.rename
    monkeypatch.setattr(atomic.os, "rename", lambda src, dst: (seen.append(src), real_rename(src, dst)))
    atomic.write_atomic(str(tmp_path / "k8s.gpushare.dev-claim_x.json"), b"{}")
    (tmp,) = seen
    name = os.path.basename(tmp)
    assert name.startswith(".k8s.gpushare.dev-claim_x.json.") and os.path.splitext(name)[1] == ".tmp"


def test_an_older_yaml_spec_of_a_claim_is_replaced_not_kept_beside(prepared, start_plugin, dirs):
    """Two files defining one device make the runtime refuse it."""
    plugin, kubelet, claim, answer = prepared
    plugin.stop(grace=1)
    json_spec = spec_path(dirs, claim.uid)
    shutil.copy(json_spec, json_spec[:-len(".json")] + ".yaml")
    start_plugin()
    assert os.listdir(dirs.cdi) == [os.path.basename(json_spec)]
    assert duplicate_devices(dirs.cdi) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the regions' tmpfs needs root (as a user they stay on the disk)")
def test_a_reboot_mounts_the_regions_tmpfs_again_and_unprepare_takes_it_away(prepared, start_plugin, dirs):
    """The regions' tmpfs is gone after a reboot (its folder on the disk is empty): start-up mounts
    it again with the regions zeroed, a tenant's writes are held to it, Unprepare unmounts it."""
    plugin, kubelet, claim, answer = prepared
    folder = os.path.join(dirs.state, "claims", claim.uid)
    assert os.path.ismount(os.path.join(folder, "region"))
    write_usage(dirs, claim.uid)
    plugin.stop(grace=1)
    unmount_regions(folder)
    edit_checkpoint(dirs, lambda claims, boot: "an-earlier-boot")
    start_plugin()
    assert os.path.ismount(os.path.join(folder, "region"))
    assert read_usage(dirs, claim.uid, REGION_SIZE) == bytes(REGION_SIZE)
    fs = os.statvfs(os.path.join(folder, "region"))
    assert fs.f_blocks * fs.f_frsize == REGION_SIZE
    with open(region(dirs, claim.uid), "r+b") as f, pytest.raises(OSError) as e:  # a tenant growing it
        f.seek(REGION_SIZE)
        f.write(bytes(2 * REGION_SIZE))  # (its sparse region leaves the rest of the 1 MiB free)
        f.flush()
    assert e.value.errno == errno.ENOSPC
    assert kubelet.prepare(claim) == answer
    assert kubelet.unprepare(claim).claims[claim.uid].error == ""
    assert not os.path.lexists(folder)
    with open("/proc/self/mountinfo") as f:
        assert folder not in f.read()
