"""The prepared-claim model: the JSON it writes is the JSON earlier releases wrote (fixtures
written by the plugin before the model existed, commit fe6c535), and a malformed document is
refused with one error naming the field and the value."""

from __future__ import annotations

import copy
import json
import os

import pytest

from kubeletplugin import checkpoint as ckpt
from kubeletplugin.claimfiles import ClaimFiles, limits_text, unmount_all_regions
from kubeletplugin.prepared import PreparedClaim, PreparedDevice, PreparedError, PreparedGpu

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
V1_UID = "6b1e3c2a-9f0d-4e5b-8a7c-1d2e3f405162"
SHARE_ID = "e2f26c2c-2c86-4087-a20a-54104cf3b0ad"


def fixture(name: str) -> bytes:
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return f.read()


@pytest.mark.parametrize("kind", ["capacity", "partition"])
def test_prepared_json_round_trips_byte_for_byte(kind):
    written = fixture(f"prepared-{kind}.json")
    claim = PreparedClaim.from_json(json.loads(written))
    assert json.dumps(claim.to_json()).encode() == written
    assert limits_text(claim).encode() == fixture(f"limits-{kind}")


def test_the_model_holds_what_the_file_says():
    claim = PreparedClaim.from_json(json.loads(fixture("prepared-capacity.json")))
    assert claim.gpus == (PreparedGpu(1, "GPU-5ea1c0de-0000-4000-8000-000000000001", 1, 2 << 30, 30, "Burst"),)
    (device,) = claim.devices
    assert device == PreparedDevice(("gpu",), "node-a", "gpu-1", SHARE_ID,
                                    (f"k8s.gpushare.dev/claim={claim.uid}-gpu-1-{SHARE_ID}",))
    assert device.cdi_name(claim.uid) == f"{claim.uid}-gpu-1-{SHARE_ID}"
    assert claim.gpu_of(device) is claim.gpus[0]
    assert claim.library.endswith("/libgpushare.so") and claim.device_nodes == ()
    partition = PreparedClaim.from_json(json.loads(fixture("prepared-partition.json")))
    assert [partition.gpu_of(d).index for d in partition.devices] == [2, 0, 2]


@pytest.fixture
def files(tmp_path):
    """A claims folder under tmp_path; the claims' region tmpfs detached at the end."""
    files = ClaimFiles(str(tmp_path))
    files.setup()
    yield files
    unmount_all_regions(str(tmp_path))


def test_files_write_the_same_prepared_json(files):
    written = fixture("prepared-partition.json")
    claim = PreparedClaim.from_json(json.loads(written))
    files.write(claim)
    with open(os.path.join(files.dir(claim.uid), "prepared.json"), "rb") as f:
        assert f.read() == written
    with open(files.limits_path(claim.uid), "rb") as f:
        assert f.read() == fixture("limits-partition")
    assert files.read_prepared(claim.uid) == claim


def test_v2_checkpoint_round_trips_byte_for_byte():
    written = fixture("checkpoint-v2.json")
    claims, boot = ckpt.decode(written)
    assert boot == "7b2e9aa5-2fa8-4b1f-a490-c7012cdcfe09"
    assert {e.state for e in claims.values()} == {ckpt.PREPARE_COMPLETED}
    assert {e.prepared.name for e in claims.values()} == {"capacity-claim", "partition-claim"}
    assert ckpt.encode(claims, boot) == written


def test_v1_checkpoint_is_migrated_through_the_model():
    old = json.loads(fixture("checkpoint-v1.json"))["claims"][V1_UID]
    claims, boot = ckpt.decode(fixture("checkpoint-v1.json"))
    assert boot is None and set(claims) == {V1_UID}
    entry = claims[V1_UID]
    assert (entry.state, entry.namespace, entry.name) == (ckpt.PREPARE_COMPLETED, "default", "legacy-claim")
    # What the version 1 migration always wrote: the old entry with its uid, no device nodes, no library.
    assert entry.prepared.to_json() == {"namespace": "default", "name": "legacy-claim", "uid": V1_UID,
                                        "gpus": old["gpus"], "devices": old["devices"], "deviceNodes": []}
    assert entry.prepared.library is None
    assert ckpt.decode(ckpt.encode(claims, None)) == (claims, None)


def test_what_prepare_can_record_reads_back():
    """A GPU NVML lost (memory 0) gives a limit of 0; a mock GPU file may set an empty uuid."""
    doc = json.loads(fixture("prepared-capacity.json"))
    doc["gpus"][0].update(memoryLimit=0, uuid="")
    doc["devices"][0]["requestNames"] = [""]
    claim = PreparedClaim.from_json(doc)
    assert (claim.gpus[0].memory_limit, claim.gpus[0].uuid, claim.devices[0].request_names) == (0, "", ("",))
    assert claim.to_json() == doc


def test_an_mps_claims_sm_count_reads_back_and_is_optional():
    doc = json.loads(fixture("prepared-capacity.json"))
    doc["sharingStrategy"] = "MPS"
    doc["gpus"][0]["smCount"] = 132
    claim = PreparedClaim.from_json(doc)
    assert claim.gpus[0].sm_count == 132 and claim.to_json() == doc
    del doc["gpus"][0]["smCount"]  # prepared before MPS claims carried it: unknown, so paced
    assert PreparedClaim.from_json(doc).gpus[0].sm_count == 0


def test_older_documents_take_the_defaults_they_implied():
    doc = json.loads(fixture("prepared-partition.json"))
    for gpu in doc["gpus"]:
        del gpu["computePolicy"]
    for device in doc["devices"]:
        del device["shareID"]
    del doc["library"], doc["deviceNodes"]
    doc["addedLater"] = {"by": "a newer release"}  # a downgrade still reads it
    claim = PreparedClaim.from_json(doc)
    assert {g.compute_policy for g in claim.gpus} == {"Hard"} and claim.library is None
    assert {d.share_id for d in claim.devices} == {None} and claim.device_nodes == ()


def set_path(doc, path, value):
    *parents, last = path
    for key in parents:
        doc = doc[key]
    if value is DELETE:
        del doc[last]
    else:
        doc[last] = value


DELETE = object()

# (path into the capacity fixture, new value, the field the error names, the value it shows)
MALFORMED = [
    (("uid",), "../../etc", "prepared.uid", "'../../etc'"),
    (("uid",), DELETE, "prepared.uid: missing", ""),
    (("namespace",), "Kube_System", "prepared.namespace", "'Kube_System'"),
    (("name",), 7, "prepared.name", "7"),
    (("gpus",), [], "prepared.gpus", "[]"),
    (("gpus",), {"index": 0}, "prepared.gpus", "{'index': 0}"),
    (("gpus", 0), "gpu", "prepared.gpus[0]", "'gpu'"),
    (("gpus", 0, "index"), -1, "prepared.gpus[0].index", "-1"),
    (("gpus", 0, "index"), True, "prepared.gpus[0].index", "True"),
    (("gpus", 0, "uuid"), 5, "prepared.gpus[0].uuid", "5"),
    (("gpus", 0, "minor"), "1", "prepared.gpus[0].minor", "'1'"),
    (("gpus", 0, "memoryLimit"), -1, "prepared.gpus[0].memoryLimit", "-1"),
    (("gpus", 0, "memoryLimit"), 1.5, "prepared.gpus[0].memoryLimit", "1.5"),
    (("gpus", 0, "computeLimit"), 101, "prepared.gpus[0].computeLimit", "101"),
    (("gpus", 0, "computeLimit"), DELETE, "prepared.gpus[0].computeLimit: missing", ""),
    (("gpus", 0, "computePolicy"), "Soft", "prepared.gpus[0].computePolicy", "'Soft'"),
    (("gpus", 0, "smCount"), -1, "prepared.gpus[0].smCount", "-1"),
    (("devices",), None, "prepared.devices", "None"),
    (("devices", 0, "requestNames"), ["gpu", 3], "prepared.devices[0].requestNames[1]", "3"),
    (("devices", 0, "requestNames"), "gpu", "prepared.devices[0].requestNames", "'gpu'"),
    (("devices", 0, "poolName"), None, "prepared.devices[0].poolName", "None"),
    (("devices", 0, "deviceName"), "gpu-1-2", "prepared.devices[0].deviceName", "'gpu-1-2'"),
    (("devices", 0, "deviceName"), "gpu-3", "prepared.devices[0].deviceName: names a GPU the claim's gpus lack",
     "'gpu-3'"),
    (("devices", 0, "shareID"), "not-a-uid", "prepared.devices[0].shareID", "'not-a-uid'"),
    (("devices", 0, "cdiDeviceIDs"), ["no-kind"], "prepared.devices[0].cdiDeviceIDs[0]", "'no-kind'"),
    (("deviceNodes",), ["/etc/shadow"], "prepared.deviceNodes[0]", "'/etc/shadow'"),
    (("library",), "libgpushare.so", "prepared.library", "'libgpushare.so'"),
]


@pytest.mark.parametrize(("path", "value", "field", "shown"), MALFORMED,
                         ids=lambda v: "DELETE" if v is DELETE else str(v)[:40])  # the same ids in each xdist worker
def test_malformed_field_is_refused_by_name_and_value(path, value, field, shown):
    doc = json.loads(fixture("prepared-capacity.json"))
    set_path(doc, path, value)
    with pytest.raises(PreparedError) as err:
        PreparedClaim.from_json(doc)
    message = str(err.value)
    assert message.startswith(field), message
    assert shown in message, message


def test_a_gpu_listed_twice_is_refused():
    doc = json.loads(fixture("prepared-partition.json"))
    doc["gpus"][1]["index"] = 0
    with pytest.raises(PreparedError, match=r"^prepared.gpus: a GPU index appears twice \(got \[0, 0\]\)"):
        PreparedClaim.from_json(doc)


def test_not_an_object_is_refused():
    with pytest.raises(PreparedError, match=r"^prepared: expected an object \(got \['gpus'\]\)"):
        PreparedClaim.from_json(["gpus"])


def test_checkpoint_with_a_malformed_entry_is_corrupt_naming_the_field():
    claims, boot = ckpt.decode(fixture("checkpoint-v2.json"))
    uid = sorted(claims)[0]
    payload = json.loads(ckpt.encode(claims, boot))
    del payload["checksum"]
    cases = [(("prepared", "gpus", 0, "memoryLimit"), "lots", f"claims['{uid}'].prepared.gpus[0].memoryLimit"),
             (("prepared", "uid"), V1_UID, f"claims['{uid}'].prepared.uid: not the entry's uid"),
             (("prepared",), None, f"claims['{uid}'].prepared: missing from a PrepareCompleted entry"),
             (("state",), "Prepared", f"claims['{uid}'].state"),
             (("namespace",), None, f"claims['{uid}'].namespace")]
    for path, value, field in cases:
        doc = copy.deepcopy(payload)
        set_path(doc["claims"][uid], path, value)
        data = json.dumps({**doc, "checksum": ckpt.checksum(doc)}).encode()
        with pytest.raises(ckpt.CheckpointCorrupt) as err:
            ckpt.decode(data)
        assert str(err.value).startswith(field), (field, str(err.value))


def test_v1_checkpoint_with_a_malformed_claim_is_corrupt():
    doc = json.loads(fixture("checkpoint-v1.json"))
    del doc["checksum"]
    doc["claims"][V1_UID]["gpus"][0]["computeLimit"] = 0
    field = rf"^claims\['{V1_UID}'\].prepared.gpus\[0\].computeLimit"
    with pytest.raises(ckpt.CheckpointCorrupt, match=field + r".*\(got 0\)"):
        ckpt.decode(json.dumps({**doc, "checksum": ckpt.checksum(doc)}).encode())


def test_claim_folder_record_of_another_claim_is_refused(files):
    claim = PreparedClaim.from_json(json.loads(fixture("prepared-capacity.json")))
    files.write(claim)
    other = "0f0f0f0f-0000-4000-8000-000000000000"
    os.rename(files.dir(claim.uid), files.dir(other))
    with pytest.raises(PreparedError, match=rf"^prepared.json.uid: not the uid of its folder \(got '{claim.uid}'\)"):
        files.read_prepared(other)
    with open(os.path.join(files.dir(other), "prepared.json"), "w") as f:
        f.write('{"uid": ')  # cut short
    with pytest.raises(PreparedError, match=r"^prepared.json: not JSON"):
        files.read_prepared(other)
    assert files.read_prepared("1f1f1f1f-0000-4000-8000-000000000000") is None  # no folder: no record


def test_a_claim_an_older_release_prepared_keeps_its_region_on_the_disk(files):
    """Its containers mount `region-<i>`: the path stays that one, repair finds nothing missing,
    and a repeated Prepare (write) makes no tmpfs beside it."""
    claim = PreparedClaim.from_json(json.loads(fixture("prepared-capacity.json")))
    files.write(claim)
    folder = files.dir(claim.uid)
    unmount_all_regions(os.path.dirname(files.root))
    os.rmdir(os.path.join(folder, "region"))  # the older layout: region-<i> files in the folder
    for i in range(len(claim.gpus)):
        with open(os.path.join(folder, f"region-{i}"), "wb") as f:
            f.write(b"in use")
    assert files.region_path(claim.uid, 0) == os.path.join(folder, "region-0")
    assert files.repair(claim) is False
    files.write(claim)
    assert not os.path.lexists(os.path.join(folder, "region"))
    with open(files.region_path(claim.uid, 0), "rb") as f:
        assert f.read(6) == b"in use"
