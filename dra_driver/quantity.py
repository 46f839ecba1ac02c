"""Kubernetes resource quantities: one place that parses and formats them.

Parsing is the kubernetes client's own (`kubernetes.utils.parse_quantity`), so a value
means here exactly what it means to the API server; this module adds the checks a byte
count needs (whole, non-negative) and errors that name the field.

Quantities come from tenants (a claim's opaque parameters, capacity requests), so the text
is checked against the Kubernetes grammar with bounded length and exponent *before* any
arithmetic: "1e1000000" (9 bytes) would otherwise become a 3.3-million-bit integer and
hold the interpreter for seconds. Every parse here is a few microseconds.
"""

from __future__ import annotations

import re
import reprlib
from decimal import Decimal, InvalidOperation

_BINARY_SUFFIXES = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))

MAX_CHARS = 64  # a real quantity is a few characters; 64 keeps every Decimal small
MAX_EXPONENT = 30  # |e| in "<n>e<exp>"; 1e30 is far beyond any byte count
MAX_AMOUNT = 2**63 - 1  # Kubernetes keeps quantities as int64 (plus a scale); so do we
# The Kubernetes quantity grammar (apimachinery resource.Quantity), ASCII digits only:
# Python's Decimal would also take "1_000", "NaN", "Infinity" and non-ASCII digits.
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE]([+-]?[0-9]+)|[KMGTPE]i|[numkMGTPE])?")


_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = _SHOW.maxlong = 200  # whole UIDs and quantities; never megabytes
_SHOW.maxlevel = 3


SHOW_CHARS = 300


def show(value: object) -> str:
    """repr() cut to a bounded length and depth, for error messages about untrusted values."""
    text = _SHOW.repr(value)
    return text if len(text) <= SHOW_CHARS else text[:SHOW_CHARS - 3] + "..."


class QuantityError(ValueError):
    """A quantity that cannot be used; the message names the field and the value."""

    def __init__(self, field: str, value: object, problem: str):
        self.field, self.value, self.problem = field, value, problem
        super().__init__(f"{field}: {problem} (got {show(value)})")


def parse_decimal(value: object, field: str) -> Decimal:
    """Parse a quantity string ("4Gi", "1.5", "250m") or an integer, bounded (see above)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise QuantityError(field, value, 'expected a quantity such as "4Gi" or an integer')
    if isinstance(value, int):
        if abs(value) > MAX_AMOUNT:
            raise QuantityError(field, value, f"out of range (at most {MAX_AMOUNT})")
        return Decimal(value)
    text = value.strip()
    if len(text) > MAX_CHARS:
        raise QuantityError(field, value, f"longer than {MAX_CHARS} characters")
    m = _QUANTITY.fullmatch(text)
    if not m:
        raise QuantityError(field, value, "not a valid quantity (examples: 4Gi, 512Mi, 1500000000)")
    if m.group(2) is not None and abs(int(m.group(2))) > MAX_EXPONENT:
        raise QuantityError(field, value, f"exponent out of range (at most e{MAX_EXPONENT})")
    from kubernetes.utils import parse_quantity  # here: the whole client is 0.5 s of every CLI start

    try:
        amount: Decimal = parse_quantity(text)  # type: ignore[no-untyped-call]
    except (ValueError, InvalidOperation, TypeError):
        raise QuantityError(field, value, "not a valid quantity (examples: 4Gi, 512Mi, 1500000000)") from None
    if abs(amount) > MAX_AMOUNT:
        raise QuantityError(field, value, f"out of range (at most {MAX_AMOUNT})")
    return amount


def parse_bytes(value: object, field: str) -> int:
    """Parse a byte count given as a quantity string ("4Gi", "512M") or an integer."""
    amount = parse_decimal(value, field)
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
