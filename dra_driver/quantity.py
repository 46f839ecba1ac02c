"""Kubernetes resource quantities: one place that parses and formats them.

Parsing is the kubernetes client's own (`kubernetes.utils.parse_quantity`), so a value
means here exactly what it means to the API server; this module adds the checks a byte
count needs (whole, non-negative) and errors that name the field.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from kubernetes.utils import parse_quantity

_BINARY_SUFFIXES = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


class QuantityError(ValueError):
    """A quantity that cannot be used; the message names the field and the value."""

    def __init__(self, field: str, value: object, problem: str):
        self.field, self.value, self.problem = field, value, problem
        super().__init__(f"{field}: {problem} (got {value!r})")


def parse_bytes(value: object, field: str) -> int:
    """Parse a byte count given as a quantity string ("4Gi", "512M") or an integer."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise QuantityError(field, value, 'expected a quantity such as "4Gi" or an integer')
    if isinstance(value, int):
        amount = Decimal(value)
    else:
        try:
            amount = parse_quantity(value.strip())
        except (ValueError, InvalidOperation, TypeError):
            raise QuantityError(field, value, "not a valid quantity (examples: 4Gi, 512Mi, 1500000000)") from None
    if not amount.is_finite():
        raise QuantityError(field, value, "not a finite quantity")
    if amount < 0:
        raise QuantityError(field, value, "must not be negative")
    if amount != amount.to_integral_value():
        raise QuantityError(field, value, "not a whole number of bytes")
    return int(amount)


def format_bytes(n: int) -> str:
    """The shortest exact binary-suffix form of a byte count: 4294967296 -> "4Gi"."""
    for suffix, size in _BINARY_SUFFIXES:
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)
