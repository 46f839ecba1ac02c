"""CEL device selectors as resource.k8s.io/v1 evaluates them, on cel-python.

The input is `device` with `driver`, `attributes[domain][name]`, `capacity[domain][name]`
and `allowMultipleAllocations`. Differences from the API server's typed CEL, kept small:
quantities are plain numbers (int, or double when fractional), so both
`device.capacity["gpushare.dev"].memory >= 10737418240` and
`...memory.compareTo(quantity("10Gi")) >= 0` work; version attributes are strings
(`semver("9.0.0")` makes the same value), ordered by compareTo/isGreaterThan/isLessThan.
"""

from __future__ import annotations

import functools
import re

import celpy
from celpy import celtypes
from celpy.evaluation import CELEvalError, CELFunction

from .devices import Device, to_quantity


class SelectorError(Exception):
    """An expression that cannot be evaluated (syntax, types); not a plain 'does not match'."""


class Semver(celtypes.StringType):
    """A version attribute: equal to its string, ordered as a semantic version."""


class _Domains(celtypes.MapType):
    # As in Kubernetes: an unknown domain reads as an empty map, not an error.
    def __missing__(self, key):
        return celtypes.MapType()


def _number(amount):
    return celtypes.IntType(int(amount)) if amount == amount.to_integral_value() else celtypes.DoubleType(float(amount))


def _version_key(version: str) -> tuple:
    m = re.match(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-([0-9A-Za-z.-]+))?", version)
    if not m:
        raise ValueError(f"not a semantic version: {version!r}")
    major, minor, patch, pre = m.groups()
    # A pre-release sorts before its release.
    return (int(major), int(minor or 0), int(patch or 0), pre is None, pre or "")


def _compare(a, b) -> celtypes.IntType:
    if isinstance(a, Semver) or isinstance(b, Semver):
        a, b = _version_key(str(a)), _version_key(str(b))
    else:  # celpy's own int/double types refuse to compare with each other
        a, b = (int(x) if isinstance(x, int) else float(x) for x in (a, b))
    return celtypes.IntType((a > b) - (a < b))


_FUNCTIONS: dict[str, CELFunction] = {
    "quantity": lambda text: _number(to_quantity(str(text))),
    "semver": lambda text: Semver(text),
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "asInteger": lambda a: celtypes.IntType(int(a)),
    "asApproximateFloat": lambda a: celtypes.DoubleType(float(a)),
    "major": lambda v: celtypes.IntType(_version_key(str(v))[0]),
    "minor": lambda v: celtypes.IntType(_version_key(str(v))[1]),
    "patch": lambda v: celtypes.IntType(_version_key(str(v))[2]),
}
_ATTRIBUTE_TYPES = {"int": celtypes.IntType, "bool": celtypes.BoolType, "string": celtypes.StringType,
                    "version": Semver}
_ENV = celpy.Environment()


@functools.lru_cache(maxsize=512)
def _program(expression: str):
    try:
        return _ENV.program(_ENV.compile(expression), functions=_FUNCTIONS)
    except Exception as e:  # celpy raises parser-specific types
        raise SelectorError(f"invalid CEL expression {expression!r}: {e}") from None


def compile_error(expression: str) -> str | None:
    """Why expression does not compile, or None when it does (the API server refuses such a
    selector on write)."""
    try:
        _program(expression)
    except SelectorError as e:
        return str(e)
    return None


def _split(qualified: str) -> tuple[str, str]:
    domain, _, name = qualified.rpartition("/")
    return domain, name


def _device_input(device: Device) -> celtypes.MapType:
    attributes, capacity = _Domains(), _Domains()
    for qualified, (kind, value) in device.attributes.items():
        domain, name = _split(qualified)
        # setdefault's result is the MapType just put there (celpy types it as any CEL value)
        attributes.setdefault(celtypes.StringType(domain), celtypes.MapType())[  # type: ignore[index,call-overload]
            celtypes.StringType(name)] = \
            _ATTRIBUTE_TYPES[kind](value)
    for qualified, cap in device.capacity.items():
        domain, name = _split(qualified)
        capacity.setdefault(celtypes.StringType(domain), celtypes.MapType())[  # type: ignore[index,call-overload]
            celtypes.StringType(name)] = \
            _number(cap.value)
    return celtypes.MapType({
        celtypes.StringType("driver"): celtypes.StringType(device.driver),
        celtypes.StringType("attributes"): attributes,
        celtypes.StringType("capacity"): capacity,
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(device.multi),
    })


def _missing_key(error: CELEvalError) -> bool:
    message = str(error.args[0]) if error.args else ""
    return message == "no such key" or message.startswith("no such member")


def matches(expression: str, device: Device) -> bool:
    """Whether the device satisfies the selector.

    A missing attribute or capacity makes the selector false for that device (the API
    server reports an error instead; here heterogeneous devices are simply skipped).
    Any other evaluation problem raises SelectorError.
    """
    if device.cel_input is None:
        device.cel_input = _device_input(device)
    try:
        result = _program(expression).evaluate({"device": device.cel_input})
    except CELEvalError as e:
        result = e
    except (TypeError, ValueError) as e:  # from our functions, e.g. semver("garbage")
        raise SelectorError(f"CEL expression {expression!r} failed on device {device.name}: {e}") from None
    if isinstance(result, CELEvalError):
        if _missing_key(result):
            return False
        raise SelectorError(f"CEL expression {expression!r} failed on device {device.name}: {result.args[0]}")
    if not isinstance(result, celtypes.BoolType):
        raise SelectorError(f"CEL expression {expression!r} returned {result!r}, not a bool")
    return bool(result)
