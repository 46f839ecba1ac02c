"""Validation as kube-apiserver does it: the upstream OpenAPI schema (strict: unknown fields are
refused) plus the semantic checks that the schema cannot express."""

import decimal
import functools
import json
import pathlib
import re

import jsonschema
import kubernetes_validate
from kubernetes.utils import parse_quantity
from referencing import Registry, Resource

from playground.emulator import admission

from ..allocator.cel import compile_error
from ..names import DNS_LABEL, DNS_SUBDOMAIN, is_extended_resource_name
from .errors import FieldError, bad_request
from .patch import CLAIM_DEVICE_KEYS

SCHEMA_ROOT = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"

DNS_LABEL_HELP = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                  "or '-', and must start and end with an alphanumeric character (e.g. 'my-name',"
                  "  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
DNS_SUBDOMAIN_HELP = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                      "characters, '-' or '.', and must start and end with an alphanumeric "
                      "character (e.g. 'example.com', regex used for validation is "
                      "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")

RESOURCE_SLICE_MAX_DEVICES = 128
RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS = 64
NODE_SELECTION_FIELDS = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")


def _version_key(name):
    return tuple(int(p) for p in name[1:].split("-")[0].split("."))


def available_kube_versions():
    """['1.25', ..., '1.37']: the versions kubernetes-validate ships strict schemas for."""
    dirs = sorted((d.name for d in SCHEMA_ROOT.iterdir() if d.name.endswith("-local-strict")),
                  key=_version_key)
    return [".".join(d[1:].split("-")[0].split(".")[:2]) for d in dirs]


def schema_dir(kube_version, strict=True):
    """The newest schema folder not newer than kube_version; strict ones refuse unknown fields."""
    wanted = tuple(int(p) for p in kube_version.lstrip("v").split(".")[:2])
    suffix = "-local-strict" if strict else "-local"
    candidates = [d for d in SCHEMA_ROOT.iterdir() if d.name.endswith(suffix)
                  and _version_key(d.name)[:2] <= wanted]
    if not candidates:
        raise ValueError(f"no schemas for Kubernetes {kube_version}")
    return max(candidates, key=lambda d: _version_key(d.name))


def _schema_file(folder, kind, group, version):
    group_prefix = group.split(".")[0] if group else ""
    file_name = f"{kind.lower()}-{group_prefix}-{version}.json" if group else \
        f"{kind.lower()}-{version}.json"
    return folder / file_name


def kube_versions_with_schemas(resource_types):
    """The available versions that have a schema for every one of resource_types."""
    return [v for v in available_kube_versions()
            if all(_schema_file(schema_dir(v), rt.kind, rt.group, rt.version).is_file() for rt in resource_types)]


@functools.cache
def _validator(kube_version, kind, group, version):
    folder = schema_dir(kube_version)
    schema = json.loads(_schema_file(folder, kind, group, version).read_text())
    definitions = json.loads((folder / "_definitions.json").read_text())
    registry = Resource.from_contents(schema) @ Registry()
    registry = Resource.from_contents(definitions) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _field_path(base, path):
    text = base
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _schema_error_to_field_errors(error):
    path = _field_path("", error.absolute_path)
    if error.validator == "additionalProperties":
        unexpected = set(error.instance) - set(error.schema.get("properties", {}))
        return [FieldError(_field_path(path, [name]), "Unknown") for name in sorted(unexpected)]
    if error.validator == "required":
        missing = error.message.split("'")[1]
        return [FieldError(_field_path(path, [missing]), "Required")]
    if error.validator == "type":
        return [FieldError(path, "TypeInvalid", f"must be of type {error.validator_value}",
                           error.instance, has_value=True)]
    if error.validator in ("oneOf", "anyOf") and error.context:
        return _schema_error_to_field_errors(jsonschema.exceptions.best_match(error.context))
    return [FieldError(path, "Invalid", error.message)]


def schema_errors(obj, rt, kube_version):
    validator = _validator(kube_version, rt.kind, rt.group, rt.version)
    errors: list[FieldError] = []
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path))):
        errors.extend(_schema_error_to_field_errors(error))
    return errors


def _check_dns(value, field, pattern, help_text, max_len, errors):
    if not isinstance(value, str):
        return
    if len(value) > max_len:
        errors.append(FieldError(field, "Invalid", f"must be no more than {max_len} characters",
                                 value, True))
    elif not pattern.fullmatch(value):
        errors.append(FieldError(field, "Invalid", help_text, value, True))


def metadata_errors(obj):
    errors: list[FieldError] = []
    _check_dns(obj["metadata"].get("name"), "metadata.name", DNS_SUBDOMAIN, DNS_SUBDOMAIN_HELP,
               253, errors)
    return errors


def _check_pool_name(name, field, errors):
    # A pool name is one or more DNS subdomains separated by slashes.
    if not isinstance(name, str):
        return
    if len(name) > 253:
        errors.append(FieldError(field, "Invalid", "must be no more than 253 characters",
                                 name, True))
        return
    for part in name.split("/"):
        if not DNS_SUBDOMAIN.fullmatch(part):
            errors.append(FieldError(field, "Invalid", DNS_SUBDOMAIN_HELP, name, True))
            return


def resource_slice_errors(slice_obj):
    errors: list[FieldError] = []
    spec = slice_obj.get("spec") or {}
    _check_dns(spec.get("driver"), "spec.driver", DNS_SUBDOMAIN, DNS_SUBDOMAIN_HELP, 63, errors)
    _check_pool_name((spec.get("pool") or {}).get("name"), "spec.pool.name", errors)
    if isinstance(spec.get("nodeName"), str):
        _check_dns(spec["nodeName"], "spec.nodeName", DNS_SUBDOMAIN, DNS_SUBDOMAIN_HELP, 253,
                   errors)
    selected = [f for f in NODE_SELECTION_FIELDS if spec.get(f) not in (None, False, "")]
    if not selected:
        errors.append(FieldError("spec", "Required", "exactly one of `nodeName`, "
                                 "`nodeSelector`, `allNodes`, `perDeviceNodeSelection` "
                                 "is required"))
    elif len(selected) > 1:
        errors.append(FieldError("spec", "Invalid", "exactly one of `nodeName`, `nodeSelector`,"
                                 " `allNodes`, `perDeviceNodeSelection` is required, but "
                                 "multiple fields are set", "{" + ", ".join(selected) + "}",
                                 True))
    devices = spec.get("devices") or []
    if not isinstance(devices, list):
        return errors
    any_taints = any(isinstance(d, dict) and d.get("taints") for d in devices)
    limit = RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS if any_taints else RESOURCE_SLICE_MAX_DEVICES
    if len(devices) > limit:
        detail = f"must have at most {limit} items"
        if any_taints:
            detail += " when any device has taints"
        errors.append(FieldError("spec.devices", "TooMany", detail, len(devices), True))
    _check_unique_names(devices, "spec.devices", errors)
    return errors


def _check_unique_names(items, base, errors):
    """Each item's `name` is a DNS label, unique in the list (devices of a slice, requests of a claim)."""
    seen = set()
    for i, item in enumerate(items if isinstance(items, list) else []):
        name = item.get("name") if isinstance(item, dict) else None
        field = f"{base}[{i}].name"
        _check_dns(name, field, DNS_LABEL, DNS_LABEL_HELP, 63, errors)
        if name in seen:
            errors.append(FieldError(field, "Duplicate", "", name, True))
        seen.add(name)


def _selector_errors(selectors, base, errors):
    """Each CEL selector must compile."""
    for i, selector in enumerate(selectors if isinstance(selectors, list) else []):
        expression = ((selector or {}).get("cel") or {}).get("expression")
        if isinstance(expression, str):
            problem = compile_error(expression)
            if problem:
                errors.append(FieldError(f"{base}[{i}].cel.expression", "Invalid",
                                         f"compilation failed: {problem}", expression, True))


def _device_request_errors(request, base, errors):
    """An exact request (or one of firstAvailable's): count > 0, selectors that compile."""
    if not isinstance(request, dict):
        return
    count = request.get("count")
    if request.get("allocationMode", "ExactCount") == "ExactCount" and isinstance(count, int) \
            and count <= 0:
        errors.append(FieldError(f"{base}.count", "Invalid", "must be greater than zero", count,
                                 True))
    _selector_errors(request.get("selectors"), f"{base}.selectors", errors)


def _claim_spec_errors(claim_spec, base):
    errors: list[FieldError] = []
    requests = ((claim_spec or {}).get("devices") or {}).get("requests") or []
    _check_unique_names(requests, f"{base}.devices.requests", errors)
    for i, request in enumerate(requests):
        field = f"{base}.devices.requests[{i}]"
        _device_request_errors(request.get("exactly"), f"{field}.exactly", errors)
        for j, sub in enumerate(request.get("firstAvailable") or []):
            _device_request_errors(sub, f"{field}.firstAvailable[{j}]", errors)
    return errors


def pod_claim_errors(pod):
    """Containers may only name claims the pod lists in spec.resourceClaims."""
    spec = pod.get("spec") or {}
    listed = [c.get("name") for c in spec.get("resourceClaims") or [] if isinstance(c, dict)]
    errors: list[FieldError] = []
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            claims = ((container or {}).get("resources") or {}).get("claims") or []
            for j, claim in enumerate(claims):
                name = (claim or {}).get("name")
                if name not in listed:
                    detail = "must be one of the names in pod.spec.resourceClaims"
                    detail += f": {', '.join(map(str, listed))}" if listed else " which is empty"
                    errors.append(FieldError(f"spec.{group}[{i}].resources.claims[{j}].name",
                                             "Invalid", detail, name, True))
    return errors


RESOURCE_HEALTH = ("Healthy", "Unhealthy", "Unknown")


def allocated_resources_status_errors(pod):
    """validateContainerStatusAllocatedResourcesStatus (pkg/apis/core/validation/validation.go):
    each status entry names a claim of its container (`claim:<claim>/<request>`, or
    `claim:<claim>` when the container's entry has no request) or one of its resource requests;
    resource IDs are unique within an entry and health is one of RESOURCE_HEALTH. Ephemeral
    containers may not have one."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    errors: list[FieldError] = []
    for group, spec_group in (("containerStatuses", "containers"), ("initContainerStatuses", "initContainers")):
        containers = {c.get("name"): c for c in spec.get(spec_group) or [] if isinstance(c, dict)}
        for i, container_status in enumerate(status.get(group) or []):
            container = containers.get((container_status or {}).get("name"))
            for j, entry in enumerate((container_status or {}).get("allocatedResourcesStatus") or []):
                path = f"status.{group}[{i}].allocatedResourcesStatus[{j}]"
                name = entry.get("name") or ""
                resources = (container or {}).get("resources") or {}
                if container is None:
                    pass  # a status for a container not in the spec is left alone, as upstream does
                elif name.startswith("claim:"):
                    names = {f"claim:{c.get('name')}" + (f"/{c['request']}" if c.get("request") else "")
                             for c in resources.get("claims") or []}
                    if name not in names:
                        errors.append(FieldError(f"{path}.name", "Invalid",
                                                 "must match one of the container's resource claims in a format "
                                                 "'claim:<claimName>/<request>' or 'claim:<claimName>' if request "
                                                 "is empty", name, True))
                elif name not in (resources.get("requests") or {}):
                    errors.append(FieldError(f"{path}.name", "Invalid",
                                             "must match one of the container's resource requests", name, True))
                seen = set()
                for k, health in enumerate(entry.get("resources") or []):
                    value = health.get("health") or ""
                    if value not in RESOURCE_HEALTH:
                        errors.append(FieldError(f"{path}.resources[{k}].health", "Unsupported",
                                                 "supported values: " + ", ".join(f'"{h}"' for h in RESOURCE_HEALTH),
                                                 value, True))
                    if health.get("resourceID") in seen:
                        errors.append(FieldError(f"{path}.resources[{k}].resourceID", "Duplicate", "",
                                                 health.get("resourceID"), True))
                    seen.add(health.get("resourceID"))
    for i, container_status in enumerate(status.get("ephemeralContainerStatuses") or []):
        if (container_status or {}).get("allocatedResourcesStatus"):
            errors.append(FieldError(f"status.ephemeralContainerStatuses[{i}].allocatedResourcesStatus",
                                     "Forbidden", "must not be specified in container status"))
    return errors


def _is_integer(value):
    try:
        amount = parse_quantity(value)
    except ValueError:
        return False
    return amount == amount.to_integral_value()


def _resource_errors(container, base):
    """Extended resources (pkg/apis/core/validation ValidateResourceRequirements): whole
    numbers, and a request only with an equal limit (they cannot be overcommitted)."""
    resources = (container or {}).get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    errors: list[FieldError] = []
    for kind, values in (("limits", limits), ("requests", requests)):
        for name, value in values.items():
            if is_extended_resource_name(name) and not _is_integer(value):
                errors.append(FieldError(f"{base}.resources.{kind}[{name}]", "Invalid", "must be an integer",
                                         value, True))
    for name, value in requests.items():
        if not is_extended_resource_name(name):
            continue
        if name not in limits:
            errors.append(FieldError(f"{base}.resources.limits", "Required",
                                     "Limit must be set for non overcommitable resources"))
        elif canonical_quantity(value) != canonical_quantity(limits[name]):
            errors.append(FieldError(f"{base}.resources.requests[{name}]", "Invalid",
                                     f"must be equal to {name} limit of {limits[name]}", value, True))
    return errors


def pod_errors(pod):
    """Claims named by containers, extended resources, and the scheduler's
    status.extendedResourceClaimStatus (its claim name, and mappings to the pod's containers)."""
    errors = pod_claim_errors(pod)
    spec = pod.get("spec") or {}
    names = set()
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            errors += _resource_errors(container, f"spec.{group}[{i}]")
            names.add((container or {}).get("name"))
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    if isinstance(status, dict):
        base = "status.extendedResourceClaimStatus"
        if not status.get("resourceClaimName"):
            errors.append(FieldError(f"{base}.resourceClaimName", "Required", "must name the claim"))
        _check_dns(status.get("resourceClaimName"), f"{base}.resourceClaimName", DNS_SUBDOMAIN,
                   DNS_SUBDOMAIN_HELP, 253, errors)
        if not status.get("requestMappings"):
            errors.append(FieldError(f"{base}.requestMappings", "Required", "must not be empty"))
        for i, mapping in enumerate(status.get("requestMappings") or []):
            if (mapping or {}).get("containerName") not in names:
                errors.append(FieldError(f"{base}.requestMappings[{i}].containerName", "Invalid",
                                         "must be the name of a container of the pod",
                                         (mapping or {}).get("containerName"), True))
            _check_dns((mapping or {}).get("requestName"), f"{base}.requestMappings[{i}].requestName",
                       DNS_LABEL, DNS_LABEL_HELP, 63, errors)
    return errors


def claim_device_id(entry):
    """An allocation result's or a status.devices entry's device: its CLAIM_DEVICE_KEYS values."""
    return tuple((entry or {}).get(f) or "" for f in CLAIM_DEVICE_KEYS)


def allocated_device_ids(claim):
    """The devices of a ResourceClaim's allocation (none when it is not allocated)."""
    results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")) or []
    return {claim_device_id(r) for r in results}


def _claim_device_status_errors(claim):
    """status.devices: each entry names a device of the claim's allocation (validateDeviceStatus,
    pkg/apis/resource/validation); a deallocated claim has none."""
    allocated = allocated_device_ids(claim)
    errors = []
    for i, entry in enumerate((claim.get("status") or {}).get("devices") or []):
        if claim_device_id(entry) not in allocated:
            driver, pool, device, share = claim_device_id(entry)
            errors.append(FieldError(f"status.devices[{i}]", "Invalid", "must be an allocated device in the claim",
                                     {"Driver": driver, "Pool": pool, "Device": device, "ShareID": share}, True))
    return errors


def semantic_errors(obj, rt):
    if rt.kind == "ResourceSlice":
        return resource_slice_errors(obj)
    if rt.kind == "ResourceClaim":
        return _claim_spec_errors(obj.get("spec"), "spec") + _claim_device_status_errors(obj)
    if rt.kind == "ResourceClaimTemplate":
        return _claim_spec_errors((obj.get("spec") or {}).get("spec"), "spec.spec")
    if rt.kind == "DeviceClass":
        errors: list[FieldError] = []
        _selector_errors((obj.get("spec") or {}).get("selectors"), "spec.selectors", errors)
        name = (obj.get("spec") or {}).get("extendedResourceName")
        if name is not None and not is_extended_resource_name(name):
            errors.append(FieldError("spec.extendedResourceName", "Invalid",
                                     "must be an extended resource name: a domain-prefixed name outside "
                                     "kubernetes.io (such as gpushare.dev/share)", name, True))
        return errors
    if rt.kind == "Pod":
        return pod_errors(obj) + allocated_resources_status_errors(obj)
    if rt.kind == "Event" and rt.group == "":
        return core_event_errors(obj)
    if rt.kind == "ValidatingAdmissionPolicy":
        return _policy_errors(obj.get("spec") or {})
    if rt.kind == "ValidatingAdmissionPolicyBinding":
        return _binding_errors(obj.get("spec") or {})
    return []


def core_event_errors(event):
    """legacyValidateEvent (pkg/apis/core/validation/events.go), all a v1 Event gets: an Event
    about a namespaced object lives in that object's namespace; one about a cluster-scoped object
    in "default" (or none; with eventTime also kube-system); with eventTime set it names its
    reporting controller and instance, its action and reason."""
    errors = []
    namespace = (event.get("metadata") or {}).get("namespace") or ""
    involved = event.get("involvedObject") or {}
    involved_namespace = involved.get("namespace") or ""
    has_event_time = bool(event.get("eventTime"))
    allowed = {"", "default"} if not has_event_time else {"default", "kube-system"}
    if (namespace not in allowed) if not involved_namespace else (
            not has_event_time and namespace != involved_namespace):
        errors.append(FieldError("involvedObject.namespace", "Invalid", "does not match event.namespace",
                                 involved_namespace, True))
    if has_event_time:
        for field, limit in (("reportingComponent", None), ("reportingInstance", 128), ("action", 128),
                             ("reason", 128)):
            value = event.get(field) or ""
            if not value:
                errors.append(FieldError("reportingController" if field == "reportingComponent" else field,
                                         "Required"))
            elif limit and len(value) > limit:
                errors.append(FieldError(field, "Invalid", f"can have at most {limit} characters", "", True))
    return errors


def _unsupported_value(field, value, supported):
    quoted = ", ".join(f'"{s}"' for s in supported)
    return FieldError(field, "Unsupported", f"supported values: {quoted}", value, True)


def _policy_errors(spec):
    """What the real server checks of a policy that admission relies on: a known
    failurePolicy, at least one validation, and CEL that compiles."""
    errors: list[FieldError] = []
    if spec.get("failurePolicy") not in (None, "Fail", "Ignore"):
        errors.append(_unsupported_value("spec.failurePolicy", spec["failurePolicy"],
                                         ("Fail", "Ignore")))
    if not spec.get("validations") and not spec.get("auditAnnotations"):
        errors.append(FieldError("spec.validations", "Required",
                                 "validations or auditAnnotations must contain at least one item"))
    expressions = [(f"spec.variables[{i}].expression", v.get("expression"))
                   for i, v in enumerate(spec.get("variables") or [])]
    for i, validation in enumerate(spec.get("validations") or []):
        expressions += [(f"spec.validations[{i}].{key}", validation.get(key))
                        for key in ("expression", "messageExpression")]
    for field, expression in expressions:
        problem = isinstance(expression, str) and admission.compile_error(expression)
        if problem:
            errors.append(FieldError(field, "Invalid", f"compilation failed: {problem}",
                                     expression, True))
    return errors


def _binding_errors(spec):
    errors: list[FieldError] = []
    if not spec.get("policyName"):
        errors.append(FieldError("spec.policyName", "Required"))
    actions = spec.get("validationActions") or []
    if not actions:
        errors.append(FieldError("spec.validationActions", "Required",
                                 "at least one validation action is required"))
    for i, action in enumerate(actions):
        if action not in ("Audit", "Deny", "Warn"):
            errors.append(_unsupported_value(f"spec.validationActions[{i}]", action,
                                             ("Audit", "Deny", "Warn")))
    return errors


QUANTITY_DEFINITION = "io.k8s.apimachinery.pkg.api.resource.Quantity"
QUANTITY_PATTERN = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
UNKNOWN = object()  # what _walk yields for a field the schema does not declare


def _walk(node, schema, definitions, path=()):
    """(path, UNKNOWN) for each field the schema does not declare (where it declares
    properties: the strict schemas refuse exactly these) and (path, value) for each value it
    types as a Quantity. A walk of the object, far cheaper than a jsonschema pass."""
    while isinstance(schema, dict) and ("$ref" in schema or "allOf" in schema):
        name = (schema.get("$ref") or schema["allOf"][0].get("$ref", "")).rsplit("/", 1)[-1]
        if name == QUANTITY_DEFINITION:
            yield path, node
            return
        schema = definitions.get(name)
    if not isinstance(schema, dict) or node is None:
        return
    if isinstance(node, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in node.items():
            if properties is not None and key in properties:
                yield from _walk(value, properties[key], definitions, path + (key,))
            elif isinstance(extra, dict):
                yield from _walk(value, extra, definitions, path + (key,))
            elif properties is not None:
                yield path + (key,), UNKNOWN
    elif isinstance(node, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(node):
            yield from _walk(value, schema["items"], definitions, path + (i,))


def _is_quantity(text):
    if not QUANTITY_PATTERN.match(text.strip()):
        return False
    try:
        parse_quantity(text.strip())
    except (ValueError, ArithmeticError):
        return False
    return True


def decode_problems(obj, rt, kube_version):
    """(paths of unknown fields in obj, [(path, stored form)] of its quantities written otherwise);
    a quantity that does not parse raises 400, as the real server's decoding does before
    validation, and the others are stored as the real server stores them (canonical_quantity)."""
    name = definition_name(kube_version, rt)
    if name is None:  # no schema for this kind: nothing is known to be unknown
        return [], []
    unknown, canonical = [], []
    for path, value in _walk(obj, {"$ref": name}, upstream_definitions(kube_version)):
        if value is UNKNOWN:
            unknown.append(path)
        elif isinstance(value, str) and not _is_quantity(value):
            raise bad_request(f"{rt.kind} in version \"{rt.version}\" cannot be handled as a "
                              f"{rt.kind}: quantities must match the regular expression "
                              f"'{QUANTITY_PATTERN.pattern}' (got {value!r} at "
                              f"{field_path(path)})")
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            text = canonical_quantity(value)
            if text != value:
                canonical.append((path, text))
    return unknown, canonical


_DECIMAL_SUFFIXES = {-3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def canonical_quantity(value):
    """The form the API server stores a Quantity in (apimachinery's CanonicalizeBytes): the
    value rounded up (away from zero) to a milli-unit, written with the largest suffix of the
    input's format (binary Ki..Ei, decimal m..E, or an e-exponent) that keeps the mantissa whole.
    Binary values below 1024 or with a fraction are written decimal. A JSON number
    (`compute: 20`) is decimal, or an exponent when it prints as one (1e+20)."""
    text = str(value).strip()
    number = parse_quantity(text).quantize(decimal.Decimal("0.001"), rounding=decimal.ROUND_UP)
    if text.endswith("i") and abs(number) >= 1024 and number == number.to_integral_value():
        mantissa, power = int(number), 0
        while power < len(_BINARY_SUFFIXES) - 1 and mantissa % 1024 == 0:
            mantissa, power = mantissa // 1024, power + 1
        return f"{mantissa}{_BINARY_SUFFIXES[power]}"
    mantissa, exponent = int(number * 1000), -3  # whole milli-units
    if mantissa == 0:
        return "0"
    while mantissa % 1000 == 0 and exponent < 18:
        mantissa, exponent = mantissa // 1000, exponent + 3
    if re.search(r"[eE][-+]?[0-9]+$", text):
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    return f"{mantissa}{_DECIMAL_SUFFIXES[exponent]}"


@functools.cache
def upstream_definitions(kube_version):
    """{name: schema} of every upstream type (the non-strict schemas)."""
    return json.loads((schema_dir(kube_version, strict=False) / "_definitions.json")
                      .read_text())["$defs"]


@functools.cache
def definition_name(kube_version, rt):
    """The upstream type name of rt's kind ('io.k8s.api.core.v1.Pod'), or None."""
    definitions = upstream_definitions(kube_version)
    gvk = {"group": rt.group, "kind": rt.kind, "version": rt.version}
    return next((name for name, schema in definitions.items()
                 if gvk in schema.get("x-kubernetes-group-version-kind", [])), None)


# Admission evaluates these, so a malformed one is refused on write, not met at admission.
SCHEMA_CHECKED_POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def field_path(path):
    """('spec', 'devices', 0, 'bogus') -> 'spec.devices[0].bogus'."""
    return _field_path("", path)


class Validator:
    def __init__(self, kube_version=None, enabled=True):
        self.kube_version = kube_version or available_kube_versions()[-1]
        self.enabled = enabled

    def decode(self, obj, rt):
        """What decoding does before validation: (unknown field paths, which the caller drops,
        warns of or refuses by the request's fieldValidation; [(path, stored form)] of quantities
        written otherwise, `20` -> "20", "0.5Gi" -> "512Mi"); bad quantities raise 400."""
        if not self.enabled:
            return [], []
        return decode_problems(obj, rt, self.kube_version)

    def errors(self, obj, rt):
        """Every FieldError for obj; schemas are applied to resource.k8s.io objects and to the
        admission policies the emulator enforces."""
        errors = metadata_errors(obj)
        if not self.enabled:
            return errors
        if rt.group == "resource.k8s.io" or rt.kind in SCHEMA_CHECKED_POLICY_KINDS:
            schema_problems = schema_errors(obj, rt, self.kube_version)
            if schema_problems:  # semantic checks assume a well-typed object
                return errors + schema_problems
        return errors + semantic_errors(obj, rt)
