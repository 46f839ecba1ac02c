"""OpenAPI v2 (/openapi/v2) and v3 (/openapi/v3, one document per group/version) for the
kinds the emulator serves, built from the upstream definitions that kubernetes-validate
ships: what `kubectl apply` (field validation support), `kubectl explain` and client-side
validation read."""

import functools
import hashlib
import json

from playground.emulator import resources

from .validation import definition_name, upstream_definitions

# Query parameters of the write verbs; kubectl looks for fieldValidation on PATCH to decide
# whether the server validates fields itself.
WRITE_PARAMS = ("dryRun", "fieldManager", "fieldValidation")
VERB_PARAMS = {"post": WRITE_PARAMS, "put": WRITE_PARAMS, "patch": WRITE_PARAMS + ("force",),
               "delete": ("dryRun", "gracePeriodSeconds", "propagationPolicy"),
               "get": ("resourceVersion",)}
LIST_PARAMS = ("labelSelector", "fieldSelector", "limit", "continue", "resourceVersion",
               "watch", "timeoutSeconds")


def _openapi_schema(node, ref_prefix):
    """A JSON-schema definition from kubernetes-validate as the API server publishes it:
    refs into ref_prefix, single types (no "null"), int-or-string and quantity as strings."""
    if isinstance(node, list):
        return [_openapi_schema(n, ref_prefix) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref":
            out[key] = ref_prefix + value.rsplit("/", 1)[-1]
        elif key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            out[key] = types[0] if len(types) == 1 else types
        elif key == "oneOf" and all(set(o) == {"type"} for o in value):
            one_of = {t for o in value for t in (o["type"] if isinstance(o["type"], list)
                                                 else [o["type"]])}
            out["type"] = "string"
            if "integer" in one_of:
                out["format"] = "int-or-string"
        elif key == "enum" and node.get("type") and None in value:
            out[key] = [v for v in value if v is not None]
        else:
            out[key] = _openapi_schema(value, ref_prefix)
    if "$ref" in out and len(out) > 1:  # OpenAPI ignores siblings of $ref; the server wraps it
        out = {**{k: v for k, v in out.items() if k != "$ref"}, "allOf": [{"$ref": out["$ref"]}]}
    return out


def _closure(names, definitions):
    """names and every definition they reference."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen or name not in definitions:
            continue
        seen.add(name)
        text = json.dumps(definitions[name])
        for part in text.split('"$ref": "')[1:]:
            todo.append(part.split('"', 1)[0].rsplit("/", 1)[-1])
    return seen


def _parameters(names, v3):
    params = []
    for name in names:
        schema = {"type": "boolean" if name in ("watch", "force") else
                  "integer" if name in ("limit", "timeoutSeconds", "gracePeriodSeconds")
                  else "string"}
        param = {"name": name, "in": "query", "uniqueItems": True}
        param.update({"schema": schema} if v3 else schema)
        params.append(param)
    return params


def _operations(rt, definition, ref_prefix, v3, item):
    gvk = {"group": rt.group, "kind": rt.kind, "version": rt.version}
    ref = {"$ref": ref_prefix + definition}
    verbs = ("get", "put", "patch", "delete") if item else ("get", "post", "delete")
    ops = {}
    for verb in verbs:
        names = VERB_PARAMS[verb] + (LIST_PARAMS if verb == "get" and not item else ())
        action = {"get": "list" if not item else "read", "post": "create", "put": "replace",
                  "patch": "patch", "delete": "delete" if item else "deletecollection"}[verb]
        op = {"operationId": f"{action}{rt.kind}", "parameters": _parameters(names, v3),
              "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
              "responses": {"200": {"description": "OK"}}}
        if verb in ("post", "put", "patch"):
            media = (["application/apply-patch+yaml", "application/json-patch+json",
                      "application/merge-patch+json", "application/strategic-merge-patch+json"]
                     if verb == "patch" else ["application/json"])
            if v3:
                op["requestBody"] = {"content": {m: {"schema": ref} for m in media},
                                     "required": True}
            else:
                op["consumes"] = media
                op["parameters"].append({"name": "body", "in": "body", "required": True,
                                         "schema": ref})
        if verb == "get" and item:
            if v3:
                op["responses"]["200"]["content"] = {"application/json": {"schema": ref}}
            else:
                op["responses"]["200"]["schema"] = ref
        ops[verb] = op
    return ops


def _paths(rts, kube_version, ref_prefix, v3):
    paths, used = {}, set()
    for rt in rts:
        definition = definition_name(kube_version, rt)
        if definition is None:
            continue
        used.add(definition)
        base = f"/api/{rt.version}" if not rt.group else f"/apis/{rt.group}/{rt.version}"
        if rt.namespaced:
            base += "/namespaces/{namespace}"
        collection = f"{base}/{rt.plural}"
        paths[collection] = _operations(rt, definition, ref_prefix, v3, item=False)
        paths[collection + "/{name}"] = _operations(rt, definition, ref_prefix, v3, item=True)
    return paths, used


def _info(kube_version):
    return {"title": "Kubernetes", "version": f"v{kube_version}.0"}


@functools.cache
def _v2_bytes(kube_version):
    definitions = upstream_definitions(kube_version)
    paths, used = _paths(resources.RESOURCE_TYPES, kube_version, "#/definitions/", v3=False)
    doc = {"swagger": "2.0", "info": _info(kube_version), "paths": paths,
           "definitions": {n: _openapi_schema(definitions[n], "#/definitions/")
                           for n in sorted(_closure(used, definitions))}}
    return json.dumps(doc).encode()


def _group_version_path(group, version):
    return f"api/{version}" if not group else f"apis/{group}/{version}"


@functools.cache
def _v3_bytes(kube_version, gv_path):
    definitions = upstream_definitions(kube_version)
    rts = [rt for rt in resources.RESOURCE_TYPES
           if _group_version_path(rt.group, rt.version) == gv_path]
    if not rts:
        return None
    paths, used = _paths(rts, kube_version, "#/components/schemas/", v3=True)
    doc = {"openapi": "3.0.0", "info": _info(kube_version), "paths": paths,
           "components": {"schemas": {
               n: _openapi_schema(definitions[n], "#/components/schemas/")
               for n in sorted(_closure(used, definitions))}}}
    return json.dumps(doc).encode()


def v2(kube_version):
    """The OpenAPI v2 document (JSON bytes)."""
    return _v2_bytes(kube_version)


def v3_root(kube_version):
    """/openapi/v3: each group/version's document address, with a hash clients cache by."""
    gv_paths = dict.fromkeys(_group_version_path(rt.group, rt.version)
                             for rt in resources.RESOURCE_TYPES)
    return {"paths": {p: {"serverRelativeURL": f"/openapi/v3/{p}?hash="
                          + hashlib.sha512(_v3_bytes(kube_version, p)).hexdigest()[:32].upper()}
                      for p in gv_paths}}


def v3(kube_version, gv_path):
    """The OpenAPI v3 document of one group/version ('apis/resource.k8s.io/v1'), or None."""
    return _v3_bytes(kube_version, gv_path)
