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

from dra_driver.mig import GpuSet

TIME_SLICING = "TimeSlicing"
MPS = "MPS"
NONE = "None"
SHARING_STRATEGIES = (TIME_SLICING, MPS, NONE)

# `priority`: what a claim's work is. A Latency claim serves requests: it needs the GPU the moment a
# request comes, which only MPS gives (its clients' kernels run at once; a time-sliced GPU makes a
# request wait for the neighbour's slice end and a context switch: docs/compute.md, "Latency").
BATCH = "Batch"
LATENCY = "Latency"
PRIORITIES = (BATCH, LATENCY)


def strategy_conflict(strategy: str, compute_policy: str, compute_limit_set: bool,
                      priority: str = BATCH) -> tuple[str, str] | None:
    """(field, problem) when a config's fields cannot hold under `strategy`, else None."""
    if compute_policy == "Burst" and strategy != TIME_SLICING:
        why = ("the MPS server's active-thread percentage is a fixed ceiling" if strategy == MPS
               else "nothing paces the claim")
        return "computePolicy", f"Burst needs sharingStrategy {TIME_SLICING}; under {strategy} {why}"
    if compute_limit_set and strategy == NONE:
        return "computeLimit", (f"sharingStrategy {NONE} enforces no compute share (the application limits "
                                f"itself); leave computeLimit out or choose {TIME_SLICING} or {MPS}")
    if priority == LATENCY and strategy != MPS:
        return "priority", (f"{LATENCY} needs sharingStrategy {MPS} (the DeviceClass mps.gpushare.dev): under "
                            f"{strategy} a request waits for the other contexts' time slice and a context switch")
    return None


# ---- which claims a GPU takes (issue 27; docs/strategies.md, "Keeping strategies apart") --------
# Every published device carries the attribute `sharingStrategy`: what its GPU serves, as the
# operator set it on the kubelet plugin (--mps-gpus, --mixed-strategies). DeviceClass selectors
# read it (deploy/base: gpushare.dev and the extended-resource classes take GPU_TIME_SLICED and
# GPU_MIXED devices, mps.gpushare.dev GPU_MPS and GPU_MIXED ones), so the scheduler, the real one
# or the playground's, never puts an MPS claim beside a time-sliced or None claim; Prepare refuses
# a claim whose strategy its GPU does not serve (a claim that named MPS through another class).
STRATEGY_ATTRIBUTE = "sharingStrategy"
GPU_TIME_SLICED = "TimeSlicing"  # TimeSlicing and None claims (the GPU time-slices their contexts)
GPU_MPS = "MPS"                  # MPS claims only: the GPU's MPS server is its only context
GPU_MIXED = "Mixed"              # every strategy: the operator allowed MPS beside the others
GPU_STRATEGIES = (GPU_TIME_SLICED, GPU_MPS, GPU_MIXED)


class GpuStrategies:
    """What each GPU of a node serves: `mps` GPU indexes ("all": every GPU) serve MPS claims only,
    the others TimeSlicing and None; `mixed`: every GPU serves every strategy."""

    def __init__(self, mps: frozenset[int] | str = frozenset(), mixed: bool = False) -> None:
        self.mps = mps
        self.mixed = mixed

    @classmethod
    def parse(cls, text: str, mixed: bool = False) -> GpuStrategies:
        """--mps-gpus: `none`, `all`, or GPU indexes separated by commas (`0,2`): GpuSet's grammar."""
        gpus = GpuSet.parse(text)
        return cls("all" if gpus.indexes is None else gpus.indexes, mixed)

    def of(self, index: int) -> str:
        """The `sharingStrategy` attribute of GPU `index`'s devices."""
        if self.mixed:
            return GPU_MIXED
        return GPU_MPS if self.mps == "all" or (isinstance(self.mps, frozenset) and index in self.mps) \
            else GPU_TIME_SLICED


def gpu_serves(gpu_strategy: str, claim_strategy: str) -> bool:
    """Whether a GPU published with `gpu_strategy` takes a claim of `claim_strategy`."""
    if gpu_strategy == GPU_MIXED:
        return True
    return (claim_strategy == MPS) == (gpu_strategy == GPU_MPS)
