"""`gpushare.dev/v1alpha1` GpuShareConfig: decode strictly, normalize, validate.

Schema for users and tools: api/gpushare.dev/v1alpha1/gpushareconfig.schema.json; a test
keeps the two in agreement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..quantity import QuantityError, parse_bytes
from .errors import ConfigError
from .strategies import BATCH, PRIORITIES, SHARING_STRATEGIES, TIME_SLICING, strategy_conflict

API_VERSION = "gpushare.dev/v1alpha1"

_Hub = TypeVar("_Hub")  # the version-independent config (passed in: the package imports this module)

# field name -> accepted JSON types, for strict decoding (bool is not an int here).
_FIELDS: dict[str, tuple[type, ...]] = {
    "apiVersion": (str,),
    "kind": (str,),
    "memoryLimit": (str, int),
    "computeLimit": (int,),
    "computePolicy": (str,),
    "sharingStrategy": (str,),
    "priority": (str,),
}


@dataclass
class GpuShareConfigV1alpha1:
    memoryLimit: int | None = None  # bytes after decoding
    computeLimit: int | None = None
    computePolicy: str | None = None
    sharingStrategy: str | None = None  # unset: the DeviceClass's choice, else TimeSlicing
    priority: str | None = None  # Batch or Latency; unset: the DeviceClass's choice, else Batch

    def normalize(self) -> None:
        """Fill defaults."""
        if self.computePolicy is None:
            self.computePolicy = "Hard"

    def validate(self) -> None:
        if self.memoryLimit is not None and self.memoryLimit <= 0:
            raise ConfigError("memoryLimit", self.memoryLimit, "must be greater than zero")
        if self.computeLimit is not None and not 1 <= self.computeLimit <= 100:
            raise ConfigError("computeLimit", self.computeLimit, "must be a percentage from 1 to 100")
        if self.computePolicy not in ("Hard", "Burst"):
            raise ConfigError("computePolicy", self.computePolicy, "must be Hard or Burst")
        if self.sharingStrategy is not None and self.sharingStrategy not in SHARING_STRATEGIES:
            raise ConfigError("sharingStrategy", self.sharingStrategy, "must be " + ", ".join(SHARING_STRATEGIES[:-1])
                              + " or " + SHARING_STRATEGIES[-1])
        if self.priority is not None and self.priority not in PRIORITIES:
            raise ConfigError("priority", self.priority, "must be " + " or ".join(PRIORITIES))
        # a Latency claim usually leaves the strategy to its DeviceClass (mps.gpushare.dev): only a
        # strategy named here conflicts with it here; Prepare checks the merged configs
        priority = (self.priority or BATCH) if self.sharingStrategy is not None else BATCH
        conflict = strategy_conflict(self.sharingStrategy or TIME_SLICING, self.computePolicy or "Hard",
                                     self.computeLimit is not None, priority)
        if conflict:
            field, problem = conflict
            raise ConfigError(field, getattr(self, field), problem)

    def to_internal(self, hub: Callable[..., _Hub]) -> _Hub:
        return hub(memory_limit=self.memoryLimit, compute_limit=self.computeLimit,
                   compute_policy=self.computePolicy, sharing_strategy=self.sharingStrategy, priority=self.priority)


def decode(obj: dict[str, Any]) -> GpuShareConfigV1alpha1:
    """Strict decoding: unknown fields and wrong types are errors naming the field."""
    for key, value in obj.items():
        if key not in _FIELDS:
            raise ConfigError(str(key), value, f"unknown field; known fields: {sorted(_FIELDS)}")
        if isinstance(value, bool) or not isinstance(value, _FIELDS[key]):
            names = " or ".join("quantity string" if t is str and key == "memoryLimit" else
                                {str: "string", int: "integer"}[t] for t in _FIELDS[key])
            raise ConfigError(key, value, f"expected {names}")
    config = GpuShareConfigV1alpha1(computeLimit=obj.get("computeLimit"), computePolicy=obj.get("computePolicy"),
                                    sharingStrategy=obj.get("sharingStrategy"), priority=obj.get("priority"))
    if "memoryLimit" in obj:
        try:
            config.memoryLimit = parse_bytes(obj["memoryLimit"], "memoryLimit")
        except QuantityError as e:
            raise ConfigError("memoryLimit", obj["memoryLimit"], e.problem) from None
    return config
