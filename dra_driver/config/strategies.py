"""Sharing strategies: how the claims that share one GPU are kept apart (docs/strategies.md).

- TimeSlicing: libgpushare.so is preloaded; it holds the memory budget and paces kernel
  launches to the compute share (the node agent sets the rate). The default.
- MPS: the claim's processes are clients of the GPU's MPS server (kernels of several claims run
  at once); the server's active-thread percentage holds compute, the library still holds memory.
- None: nothing is injected; the scheduler still counts the claim's memory and compute and the
  node agent's backstop still kills a claim past its memory; the application limits itself.

One place for the names and for which combinations cannot hold: the decoder (per config) and
Prepare (after a DeviceClass's and a claim's configs are merged) both ask strategy_conflict.
"""

from __future__ import annotations

TIME_SLICING = "TimeSlicing"
MPS = "MPS"
NONE = "None"
SHARING_STRATEGIES = (TIME_SLICING, MPS, NONE)


def strategy_conflict(strategy: str, compute_policy: str, compute_limit_set: bool) -> tuple[str, str] | None:
    """(field, problem) when a config's fields cannot hold under `strategy`, else None."""
    if compute_policy == "Burst" and strategy != TIME_SLICING:
        why = ("the MPS server's active-thread percentage is a fixed ceiling" if strategy == MPS
               else "nothing paces the claim")
        return "computePolicy", f"Burst needs sharingStrategy {TIME_SLICING}; under {strategy} {why}"
    if compute_limit_set and strategy == NONE:
        return "computeLimit", (f"sharingStrategy {NONE} enforces no compute share (the application limits "
                                f"itself); leave computeLimit out or choose {TIME_SLICING} or {MPS}")
    return None
