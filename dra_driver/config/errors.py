from __future__ import annotations

from ..quantity import show


class ConfigError(ValueError):
    """A config that cannot be used. `field` is a dotted path, `value` what was found."""

    def __init__(self, field: str, value: object, problem: str):
        self.field = field
        self.value = value
        self.problem = problem
        where = field or "config"
        super().__init__(f"{where}: {problem} (got {show(value)})")
