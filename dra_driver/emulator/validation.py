"""Validation as kube-apiserver does it: the upstream OpenAPI schema (strict: unknown fields are
refused) plus the semantic checks that the schema cannot express."""

import functools
import json
import pathlib
import re

import jsonschema
import kubernetes_validate
from referencing import Registry, Resource

from .errors import FieldError

SCHEMA_ROOT = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # fullmatch only
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")  # fullmatch only
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


def _schema_dir(kube_version):
    wanted = tuple(int(p) for p in kube_version.lstrip("v").split(".")[:2])
    candidates = [d for d in SCHEMA_ROOT.iterdir() if d.name.endswith("-local-strict")
                  and _version_key(d.name)[:2] <= wanted]
    if not candidates:
        raise ValueError(f"no schemas for Kubernetes {kube_version}")
    return max(candidates, key=lambda d: _version_key(d.name))


@functools.lru_cache(maxsize=None)
def _validator(kube_version, kind, group, version):
    schema_dir = _schema_dir(kube_version)
    group_prefix = group.split(".")[0] if group else ""
    file_name = f"{kind.lower()}-{group_prefix}-{version}.json" if group else \
        f"{kind.lower()}-{version}.json"
    schema = json.loads((schema_dir / file_name).read_text())
    definitions = json.loads((schema_dir / "_definitions.json").read_text())
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
    errors = []
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
    errors = []
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
    errors = []
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


def _claim_spec_errors(claim_spec, base):
    errors = []
    requests = ((claim_spec or {}).get("devices") or {}).get("requests") or []
    _check_unique_names(requests, f"{base}.devices.requests", errors)
    return errors


def semantic_errors(obj, rt):
    if rt.kind == "ResourceSlice":
        return resource_slice_errors(obj)
    if rt.kind == "ResourceClaim":
        return _claim_spec_errors(obj.get("spec"), "spec")
    if rt.kind == "ResourceClaimTemplate":
        return _claim_spec_errors((obj.get("spec") or {}).get("spec"), "spec.spec")
    return []


class Validator:
    def __init__(self, kube_version=None, enabled=True):
        self.kube_version = kube_version or available_kube_versions()[-1]
        self.enabled = enabled

    def errors(self, obj, rt):
        """Every FieldError for obj; schemas are applied to resource.k8s.io objects only."""
        errors = metadata_errors(obj)
        if not self.enabled:
            return errors
        if rt.group == "resource.k8s.io":
            schema_problems = schema_errors(obj, rt, self.kube_version)
            if schema_problems:  # semantic checks assume a well-typed object
                return errors + schema_problems
        return errors + semantic_errors(obj, rt)
