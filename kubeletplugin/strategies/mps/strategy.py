"""The MPS strategy as the driver calls it: after each Prepare and Unprepare of an MPS claim, its
GPU's control daemon gets the limits of the GPU's MPS claims now (started with the first, stopped
with the last: control.py)."""

from __future__ import annotations

from collections.abc import Mapping

from dra_driver.config import MPS
from dra_driver.log import get_logger
from kubeletplugin.prepared import PreparedClaim
from kubeletplugin.strategies import Strategy, StrategyError

from .control import MpsControl, MpsError

log = get_logger("kubeletplugin.mps")


class Mps(Strategy):
    def __init__(self, control: MpsControl) -> None:
        self.control = control

    def apply(self, claim: PreparedClaim, claims: Mapping[str, PreparedClaim]) -> None:
        if claim.sharing_strategy != MPS:
            return
        uuid = claim.gpus[0].uuid
        try:
            self.control.apply(uuid, [c.gpus[0] for c in claims.values()
                                      if c.sharing_strategy == MPS and c.gpus[0].uuid == uuid])
        except MpsError as e:
            raise StrategyError("sharingStrategy MPS", "mps", e) from None

    def recover(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Each GPU with MPS claims has its daemon (found after a plugin restart, started again
        after a reboot) with their limits; a failure is logged, the claims' containers retry."""
        for uid, claim in claims.items():
            try:
                self.apply(claim, claims)
            except StrategyError as e:
                log.error("MPS control daemon not ready", uid=uid, step="recover", error=str(e.cause))
