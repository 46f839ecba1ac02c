"""The opaque device configuration API (`gpushare.dev/*`, kind `GpuShareConfig`).

Users write a versioned object; `decode()` picks the version's module, which decodes it
strictly, fills defaults (normalize) and checks it (validate), then converts it to the
version-independent `GpuShareConfig` that the rest of the driver uses. A new version
(v1beta1) is a new module registered in `_VERSIONS`; v1alpha1 users keep working.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from . import v1alpha1
from .errors import ConfigError
from .strategies import BATCH, LATENCY, MPS, NONE, PRIORITIES, SHARING_STRATEGIES, TIME_SLICING, strategy_conflict

GROUP = "gpushare.dev"
KIND = "GpuShareConfig"


class _Versioned(Protocol):
    """A decoded object of one version (e.g. v1alpha1.GpuShareConfigV1alpha1)."""

    def normalize(self) -> None: ...
    def validate(self) -> None: ...
    def to_internal(self, hub: type[GpuShareConfig]) -> GpuShareConfig: ...


class _Version(Protocol):
    """What a version module (e.g. v1alpha1) provides."""

    def decode(self, obj: dict[str, Any]) -> _Versioned: ...


_VERSIONS: dict[str, _Version] = {v1alpha1.API_VERSION: v1alpha1}

COMPUTE_POLICIES = ("Hard", "Burst")


@dataclass(frozen=True)
class GpuShareConfig:
    """A decoded, validated config. `None` limits leave the allocation's value alone."""

    memory_limit: int | None = None  # bytes
    compute_limit: int | None = None  # percent, 1..100
    compute_policy: str = "Hard"
    sharing_strategy: str | None = None  # SHARING_STRATEGIES; None: not chosen here
    priority: str | None = None  # PRIORITIES; None: not chosen here (Batch by default)

    def apply(self, memory_bytes: int, compute_percent: int) -> tuple[int, int]:
        """Lower an allocation's limits by this config; never raises them."""
        if self.memory_limit is not None:
            memory_bytes = min(memory_bytes, self.memory_limit)
        if self.compute_limit is not None:
            compute_percent = min(compute_percent, self.compute_limit)
        return memory_bytes, compute_percent


def decode(obj: Any) -> GpuShareConfig:
    """Decode an opaque parameters object; raises ConfigError naming the field and value."""
    if not isinstance(obj, dict):
        raise ConfigError("", obj, "expected an object with apiVersion and kind")
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str):
        raise ConfigError("apiVersion", api_version, f"must be one of {sorted(_VERSIONS)}")
    module = _VERSIONS.get(api_version)
    if module is None:
        raise ConfigError("apiVersion", api_version, f"unsupported; supported versions: {sorted(_VERSIONS)}")
    if obj.get("kind") != KIND:
        raise ConfigError("kind", obj.get("kind"), f"must be {KIND!r}")
    versioned = module.decode(obj)
    versioned.normalize()
    versioned.validate()
    return versioned.to_internal(GpuShareConfig)


__all__ = ["BATCH", "ConfigError", "GpuShareConfig", "GROUP", "KIND", "COMPUTE_POLICIES", "LATENCY", "MPS", "NONE",
           "PRIORITIES", "SHARING_STRATEGIES", "TIME_SLICING", "decode", "strategy_conflict"]
