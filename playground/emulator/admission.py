"""ValidatingAdmissionPolicy enforcement, as kube-apiserver's admission plugin does it, on
cel-python: the policies' CEL (with Kubernetes' quantity library), matchConstraints'
resourceRules, the bindings' validationActions and the policy's failurePolicy.

Supported: what deploy/base/admission.yaml and plain policies use (`object`, `oldObject`,
`request`, `variables`, `validations` with message/messageExpression/reason), and `params`: a
policy's paramKind with a binding's paramRef by `name` (and `namespace`) and its
parameterNotFoundAction, as deploy/base/admission-requests.yaml reads the DeviceClass the
plugins annotate. A policy or binding that uses anything else (matchConditions, selectors,
a paramRef selector, matchResources, audit annotations) is a configuration error, refused or
let through by failurePolicy as the real server does with a policy it cannot configure.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError, CELFunction
from kubernetes.utils import parse_quantity

from .errors import ApiError

# cel-python logs each step of every evaluation at DEBUG: under a debug root logger (the test
# suite's, a --log-level debug playground) one policy check wrote thousands of records and took
# seconds (24 s for one test in the suite, 0.24 s alone). Its warnings still come through.
logging.getLogger("celpy").setLevel(logging.WARNING)

POLICY_GROUP = "admissionregistration.k8s.io"

# Kubernetes' CEL quantity library (k8s.io/apiserver/pkg/cel/library/quantity.go: isQuantity,
# quantity(), sign(), isInteger(), asInteger(), compareTo(), isGreaterThan(), isLessThan()) and
# the strings extension's join(), which cel-python lacks: the grammar of resource.ParseQuantity,
# values by the client's parser.
_QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)"
                       r"(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+))?$")


class Quantity(celtypes.StringType):
    def amount(self) -> Decimal:
        return parse_quantity(str(self))


def _quantity(text):
    if not _QUANTITY.match(str(text)):
        raise ValueError(f"not a quantity: {text!r}")
    return Quantity(text)


def _sign(q: Quantity) -> celtypes.IntType:
    amount = q.amount()
    return celtypes.IntType((amount > 0) - (amount < 0))


def _is_integer(q: Quantity) -> celtypes.BoolType:
    amount = q.amount()
    return celtypes.BoolType(amount == amount.to_integral_value() and -2**63 <= amount < 2**63)


def _as_integer(q: Quantity) -> celtypes.IntType:
    if not _is_integer(q):
        raise ValueError("cannot convert value to integer")
    return celtypes.IntType(int(q.amount()))


def _compare_to(q: Quantity, other: Quantity) -> celtypes.IntType:
    a, b = q.amount(), other.amount()
    return celtypes.IntType((a > b) - (a < b))


def _join(items: celtypes.ListType, separator: str = "") -> celtypes.StringType:
    texts = [item for item in items if isinstance(item, str)]
    if len(texts) != len(items):
        raise TypeError("join: the list must hold strings")
    return celtypes.StringType(str(separator).join(texts))


FUNCTIONS: dict[str, CELFunction] = {
    "isQuantity": lambda text: celtypes.BoolType(bool(_QUANTITY.match(str(text)))),
    "quantity": _quantity,
    "sign": _sign,
    "isInteger": _is_integer,
    "asInteger": _as_integer,
    "compareTo": _compare_to,
    "isGreaterThan": lambda q, other: celtypes.BoolType(_compare_to(q, other) > 0),
    "isLessThan": lambda q, other: celtypes.BoolType(_compare_to(q, other) < 0),
    "join": _join,
}
_ENV = celpy.Environment()


class ExpressionError(Exception):
    """An expression that does not compile or fails to evaluate; the message is the real
    server's (`expression '...' resulted in error: ...`)."""


@functools.lru_cache(maxsize=256)
def _program(expression: str):
    try:
        return _ENV.program(_ENV.compile(expression), functions=FUNCTIONS)
    except Exception as e:  # celpy raises parser-specific types
        raise ExpressionError(f"compilation error: {e}") from None


def compile_error(expression: str) -> str | None:
    """Why expression does not compile, or None (the real server refuses such a policy)."""
    try:
        _program(expression)
    except ExpressionError as e:
        return str(e).removeprefix("compilation error: ")
    return None


def evaluate(expression: str, activation: dict):
    """The value of expression; ExpressionError when it cannot be had."""
    try:
        return _program(expression).evaluate(activation)
    except CELEvalError as e:
        detail = e.args[0] if e.args else e
    except (TypeError, ValueError, ArithmeticError) as e:  # from our functions
        detail = e
    raise ExpressionError(f"expression '{expression}' resulted in error: {detail}")


def request_attributes(group, version, resource, kind, operation, namespace, name,
                       subresource="", dry_run=False) -> dict:
    """The CEL `request` (admission.k8s.io AdmissionRequest) fields the emulator fills in."""
    gvr = {"group": group, "version": version, "resource": resource}
    gvk = {"group": group, "version": version, "kind": kind}
    return {"kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "subResource": subresource, "name": name,
            "namespace": namespace, "operation": operation, "dryRun": dry_run,
            "userInfo": {"username": "system:admin", "groups": ["system:masters"]}}


def activation(policy_spec: dict, obj, old, request: dict, params=None) -> dict:
    """`object`, `oldObject`, `request`, `params` (null without one) and the policy's
    `variables`, each variable seeing the ones before it. A variable that fails holds its error,
    which fails only the expressions that use it (as the real server evaluates variables lazily)."""
    bound = {"object": json_to_cel(obj), "oldObject": json_to_cel(old),
             "request": json_to_cel(request), "params": json_to_cel(params)}
    variables: dict = {}
    for variable in policy_spec.get("variables") or []:
        context = {**bound, "variables": celtypes.MapType(variables)}
        try:
            value = evaluate(variable["expression"], context)
        except ExpressionError as e:
            value = CELEvalError(str(e))
        variables[celtypes.StringType(variable["name"])] = value
    bound["variables"] = celtypes.MapType(variables)
    return bound


@dataclass
class Decision:
    """One validation's outcome: admitted, denied (with message and reason) or an error."""
    denied: bool
    message: str = ""
    reason: str = "Invalid"
    error: bool = False


def validate(policy_spec: dict, context: dict) -> list[Decision]:
    """Each validation of the policy against the activation, with the real server's message
    choice: messageExpression (a non-empty single line), else message, else the expression."""
    decisions = []
    for validation in policy_spec.get("validations") or []:
        expression = validation["expression"]
        try:
            result = evaluate(expression, context)
        except ExpressionError as e:
            decisions.append(Decision(True, str(e), error=True))
            continue
        if isinstance(result, celtypes.BoolType) and result:  # anything else denies
            decisions.append(Decision(False))
            continue
        message = ""
        if validation.get("messageExpression"):
            try:
                value = evaluate(validation["messageExpression"], context)
            except ExpressionError:  # the real server logs it and falls back
                value = None
            if isinstance(value, str) and "\n" not in value.strip():
                message = str(value).strip()
        message = message or (validation.get("message") or "").strip() or \
            f"failed expression: {expression.strip()}"
        decisions.append(Decision(True, message, validation.get("reason") or "Invalid"))
    return decisions


# --- the admission plugin -----------------------------------------------------------------

_UNSUPPORTED_POLICY = ("matchConditions", "auditAnnotations")
_UNSUPPORTED_CONSTRAINTS = ("namespaceSelector", "objectSelector", "excludeResourceRules")
_UNSUPPORTED_BINDING = ("matchResources",)
_UNSUPPORTED_PARAM_REF = ("selector",)
# Finds a param: (apiVersion, kind, namespace or "", name) -> the object, or None.
ParamLookup = Callable[[str, str, str, str], "dict | None"]
_NOT_FOUND = object()
REASON_CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413}


def _rule_matches(rule: dict, request: dict) -> bool:
    resource = request["resource"]
    sub = request["subResource"]
    wanted = resource["resource"] + (f"/{sub}" if sub else "")

    def listed(values, value):
        return "*" in (values or []) or value in (values or [])

    def resource_listed(entry):
        if entry == wanted or entry == "*/*":
            return True
        head, _, tail = entry.partition("/")
        if not sub:
            return entry == "*"
        return (head in ("*", resource["resource"])) and tail in ("*", sub)

    return (listed(rule.get("apiGroups"), resource["group"])
            and listed(rule.get("apiVersions"), resource["version"])
            and listed(rule.get("operations"), request["operation"])
            and any(resource_listed(e) for e in rule.get("resources") or []))


def _unsupported(spec: dict, fields) -> str | None:
    for name in fields:
        if spec.get(name) not in (None, {}, []):
            return name
    return None


def _matches(policy: dict, request: dict) -> bool:
    constraints = policy.get("spec", {}).get("matchConstraints") or {}
    return any(_rule_matches(rule, request) for rule in constraints.get("resourceRules") or [])


def _param(spec: dict, binding_spec: dict, request: dict, lookup: ParamLookup | None):
    """The binding's param object: None for a policy without paramKind, _NOT_FOUND when the
    paramRef names none that exists; a str is the configuration problem."""
    kind = spec.get("paramKind")
    ref = binding_spec.get("paramRef")
    if not kind:
        return "paramRef" if ref else None
    if not ref:
        return "a policy with paramKind and a binding without paramRef"
    unsupported = _unsupported(ref, _UNSUPPORTED_PARAM_REF)
    if unsupported or not ref.get("name"):
        return f"paramRef {unsupported or 'without name'}"
    namespace = ref.get("namespace") or ""
    found = lookup(kind.get("apiVersion", ""), kind.get("kind", ""), namespace, ref["name"]) if lookup else None
    return _NOT_FOUND if found is None else found


def admit(policies: list[dict], bindings: list[dict], obj, old, request: dict,
          warnings: list, params: ParamLookup | None = None) -> None:
    """Apply every bound policy that matches the request: Deny refuses (the first denial is
    raised as the real server's 422), Warn adds a warning, Audit is not acted on. `params`
    finds a binding's paramRef (a policy with paramKind)."""
    denials = []
    for policy in sorted(policies, key=lambda p: p["metadata"]["name"]):
        name = policy["metadata"]["name"]
        spec = policy.get("spec") or {}
        bound = sorted((b for b in bindings if (b.get("spec") or {}).get("policyName") == name),
                       key=lambda b: b["metadata"]["name"])
        if not bound or not _matches(policy, request):
            continue
        fail = spec.get("failurePolicy", "Fail") != "Ignore"
        problem = _unsupported(spec, _UNSUPPORTED_POLICY) or _unsupported(
            spec.get("matchConstraints") or {}, _UNSUPPORTED_CONSTRAINTS)
        for binding in bound:
            binding_spec = binding.get("spec") or {}
            param = None if problem else _param(spec, binding_spec, request, params)
            unsupported = problem or _unsupported(binding_spec, _UNSUPPORTED_BINDING) or (
                param if isinstance(param, str) else None)
            if unsupported:
                if fail:
                    what = "policy" if problem else "binding"
                    denials.append((name, binding, Decision(
                        True, f"failed to configure {what}: the API emulator does not support "
                              f"{unsupported}")))
                continue
            actions = binding_spec.get("validationActions") or []
            if param is _NOT_FOUND:
                if (binding_spec.get("paramRef") or {}).get("parameterNotFoundAction") == "Deny" and \
                        "Deny" in actions:
                    denials.append((name, binding, Decision(
                        True, "failed to configure binding: no params found for policy binding with "
                              "`Deny` parameterNotFoundAction")))
                continue  # Allow: the binding does not apply
            context = activation(spec, obj, old, request, param)
            for decision in validate(spec, context):
                if not decision.denied or (decision.error and not fail):
                    continue
                if "Deny" in actions:
                    denials.append((name, binding, decision))
                if "Warn" in actions:
                    warnings.append(f"Validation failed for ValidatingAdmissionPolicy '{name}' "
                                    f"with binding '{binding['metadata']['name']}': "
                                    f"{decision.message}")
    if denials:
        name, binding, decision = denials[0]
        raise _denied(name, binding["metadata"]["name"], decision, request)


def _denied(policy: str, binding: str, decision: Decision, request: dict) -> ApiError:
    """admission.NewForbidden's message and details, with the decision's reason and code."""
    message = f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: " \
              f"{decision.message}"
    resource = request["resource"]
    qualified = resource["resource"] + (f".{resource['group']}" if resource["group"] else "")
    name = request["name"]
    head = f'{qualified} "{name}"' if name else qualified
    details = {"name": name, **({"group": resource["group"]} if resource["group"] else {}),
               "kind": resource["resource"], "causes": [{"message": message}]}
    reason = decision.reason or "Invalid"
    return ApiError(REASON_CODES.get(reason, 422), f"{head} is forbidden: {message}", reason,
                    details)
