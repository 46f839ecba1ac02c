"""The ways a GPU is shared on the node, each in a folder of its own, and the one interface the
driver (kubeletplugin/driver.py) calls them through (docs/kubelet-plugin.md, "Strategies"):

- timeslicing/: the library alone budgets and paces a claim's processes; nothing to make on the node;
- mps/: one MPS control daemon per GPU for its sharingStrategy MPS claims (control.py), its
  folders (layout.py), run chrooted in a driver root (root.py);
- mig/: the MIG instance of a MIG device, made when a claim of it is prepared (strategy.py), and
  the ledger that makes that crash-safe (ledger.py).

The driver calls every strategy at the same points of a claim's life; each acts on the claims that
are its own (by sharingStrategy, or by the devices allocated) and passes the others by. The node
agent's side of MPS (kubeletplugin/agent/mpswatch.py) stays with the agent: it follows the agent's
period and reports through the agent's claim view, and reads only mps/layout.py's names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubeletplugin.prepared import PreparedClaim


class StrategyError(Exception):
    """A strategy could not do its part of a claim's Prepare: the claim's error reads `what: cause`,
    counted under `reason` (kubelet plugin metrics, docs/kubelet-plugin.md)."""

    def __init__(self, what: str, reason: str, cause: Exception) -> None:
        super().__init__(f"{what}: {cause}")
        self.reason = reason
        self.cause = cause


class Strategy:
    """One way of sharing a GPU, as the driver's Prepare, Unprepare and start-up call it. Each
    step does nothing here: a strategy overrides the steps it has."""

    def acquire(self, claim: PreparedClaim) -> PreparedClaim:
        """Prepare, before the claim's files are written: what its devices need made on the node
        (a MIG instance); the claim as it is then. StrategyError: the Prepare fails and is rolled back."""
        return claim

    def apply(self, claim: PreparedClaim, claims: Mapping[str, PreparedClaim]) -> None:
        """After the claim's files are written (Prepare, before its CDI spec) or removed (Unprepare):
        `claims` are the node's prepared claims now, with it or without it. StrategyError: a Prepare
        fails and is rolled back; an Unprepare only logs it."""

    def release(self, uid: str) -> None:
        """The claim's state is being removed (Unprepare, a rolled-back Prepare, recovery), after its
        files: give back what acquire made for it."""

    def recover(self, claims: Mapping[str, PreparedClaim]) -> None:
        """At start-up, once every prepared claim (`claims`) has its files and CDI spec: bring the
        strategy's own state on the node in line with them."""
