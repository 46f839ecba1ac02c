"""The MIG strategy as the driver calls it: a claim of MIG devices gets their instances made (or
joined) before its files are written, with the MIG UUIDs its CDI spec names and, on real GPUs, the
instances' capability nodes; Unprepare gives them back; recovery finishes what a crash left
(ledger.py). A claim without MIG devices is passed by."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from dra_driver.mig import MigError
from kubeletplugin.prepared import PreparedClaim
from kubeletplugin.strategies import Strategy, StrategyError

from .ledger import MigState

MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"


class Mig(Strategy):
    def __init__(self, state: MigState | None, capability_nodes: bool) -> None:
        self.state = state  # None: --mig-gpus names no GPU
        self.capability_nodes = capability_nodes  # real GPUs: the instances' /dev/nvidia-caps nodes too

    def acquire(self, claim: PreparedClaim) -> PreparedClaim:
        """The claim with its MIG devices' instances made (or joined): their UUIDs and IDs recorded."""
        if not any(g.mig for g in claim.gpus):
            return claim
        try:
            return self._acquire(claim)
        except MigError as e:
            raise StrategyError("MIG", "mig", e) from None

    def _acquire(self, claim: PreparedClaim) -> PreparedClaim:
        if self.state is None:
            raise MigError("the claim has MIG devices but this plugin's --mig-gpus names no GPU")
        gpus = []
        for gpu in claim.gpus:
            if gpu.mig is not None:
                instance, uuid = self.state.acquire(claim.uid, gpu.mig)
                gpu = replace(gpu, uuid=uuid, mig=instance)
            gpus.append(gpu)
        nodes = claim.device_nodes
        if self.capability_nodes:  # the MIG devices' capabilities besides the GPU's nodes (docs/mig.md)
            nodes = (*nodes, *(n for g in gpus if g.mig for n in mig_capability_nodes(g.minor, g.mig.gpu_instance,
                                                                                     g.mig.compute_instance)))
        return replace(claim, gpus=tuple(gpus), device_nodes=nodes)

    def release(self, uid: str) -> None:
        if self.state is not None:
            self.state.release_claim(uid)

    def recover(self, claims: Mapping[str, PreparedClaim]) -> None:
        if self.state is not None:
            self.state.recover(dict(claims))


def mig_capability_nodes(minor: int, gpu_instance: int, compute_instance: int,
                         minors_file: str = MIG_MINORS) -> tuple[str, ...]:
    """/dev/nvidia-caps/nvidia-cap<N> of a MIG device's GPU and compute instance: the access
    capabilities a process needs to open it (NVIDIA MIG user guide, "Device Nodes and
    Capabilities"; the driver lists them as `gpu<minor>/gi<id>/access <N>` and
    `gpu<minor>/gi<id>/ci<id>/access <N>`). None where the file is missing."""
    wanted = {f"gpu{minor}/gi{gpu_instance}/access", f"gpu{minor}/gi{gpu_instance}/ci{compute_instance}/access"}
    try:
        with open(minors_file) as f:
            lines = f.read().splitlines()
    except OSError:
        return ()
    return tuple(f"/dev/nvidia-caps/nvidia-cap{parts[1]}" for parts in (line.split() for line in lines)
                 if len(parts) == 2 and parts[0] in wanted and parts[1].isdigit())
