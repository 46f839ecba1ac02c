"""The MIG ledger's recovery against the claims prepared (kubeletplugin/migstate.py), with a stand-in
for NVML's instances: what a lost ledger, a borrowed instance and an instance whose GPU instance
ID now names someone else's become at start-up."""

from __future__ import annotations

import json
import os

from dra_driver.mig import MigInstance, MigProfile
from kubeletplugin.prepared import PreparedClaim, PreparedDevice, PreparedGpu, PreparedMig
from kubeletplugin.strategies.mig.ledger import BORROWED, CREATED, LedgerEntry, MigState

GPU = "GPU-5ea1c0de-0000-4000-8000-000000000000"
P3G = MigProfile("3g.40gb", 9, 3, 40448 << 20, 60, 3, 3, 0, 3, 0, (0, 4), 4)
UID = "3f1c2a9e-6f0b-4d5e-9a43-2f5c0b7d9e11"


class Instances:
    """NVML's instances of one GPU, as MigInstances answers."""

    def __init__(self, *made: MigInstance) -> None:
        self.made = list(made)
        self.destroyed: list[int] = []

    def list(self, gpu, profiles):
        return list(self.made)

    def destroy(self, gpu, gi_id):
        self.destroyed.append(gi_id)
        self.made = [i for i in self.made if i.gi_id != gi_id]
        return True


def prepared(uuid: str, gi: int) -> PreparedClaim:
    mig = PreparedMig(GPU, "3g.40gb", 9, 4, gi, 0)
    return PreparedClaim("default", "c", UID, (PreparedGpu(0, uuid, 0, 1 << 30, 100, mig=mig),),
                         (PreparedDevice(("mig",), "node", "gpu-0-mig-3g-40gb-4"),))


def state(tmp_path, instances) -> MigState:
    return MigState(instances, str(tmp_path), lambda gpu: (P3G,))


def ledger(tmp_path) -> list[dict]:
    with open(os.path.join(tmp_path, "mig.json")) as f:
        return json.load(f)["instances"]


def test_a_prepared_claims_instance_the_ledger_lost_is_adopted(tmp_path):
    ours = MigInstance(GPU, 2, 0, 9, 4, "MIG-a")
    nvml = Instances(ours)
    state(tmp_path, nvml).recover({UID: prepared("MIG-a", 2)})
    assert nvml.destroyed == []
    assert [(e["state"], e["uuid"], e["claims"]) for e in ledger(tmp_path)] == [(CREATED, "MIG-a", [UID])]


def test_a_borrowed_instance_is_forgotten_never_destroyed(tmp_path):
    theirs = MigInstance(GPU, 1, 0, 9, 4, "MIG-theirs")
    nvml = Instances(theirs)
    s = state(tmp_path, nvml)
    s.ledger.put(LedgerEntry(GPU, 9, 4, BORROWED, (), 1, 0, "MIG-theirs", (UID,)))
    s.recover({})  # its claim is gone
    assert nvml.destroyed == [] and nvml.made == [theirs] and ledger(tmp_path) == []


def test_an_id_that_names_another_instance_now_is_left_alone(tmp_path):
    # ours (MIG-a, GPU instance 2) is gone; someone made MIG-b, which got ID 2
    nvml = Instances(MigInstance(GPU, 2, 0, 9, 4, "MIG-b"))
    s = state(tmp_path, nvml)
    s.ledger.put(LedgerEntry(GPU, 9, 4, CREATED, (), 2, 0, "MIG-a", (UID,)))
    s.recover({})
    assert nvml.destroyed == [] and ledger(tmp_path) == []
