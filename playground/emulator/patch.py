"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902)."""

import copy
import json

from .errors import ApiError, bad_request

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply: Registry.apply

# Lists that strategic merge patch merges instead of replacing: path -> merge key fields
# (an empty tuple merges a list of strings as a set). Other lists are replaced.
STRATEGIC_MERGE_KEYS = {
    ("metadata", "finalizers"): (),
    ("metadata", "ownerReferences"): ("uid",),
    ("status", "conditions"): ("type",),
    ("status", "reservedFor"): ("uid",),
    ("spec", "containers"): ("name",),
}
# Lists that server-side apply merges by key (x-kubernetes-list-type: map, with their
# x-kubernetes-list-map-keys), item by item, each owned by the managers that applied it.
# ResourceClaim status.devices is not in STRATEGIC_MERGE_KEYS: it has no patch strategy, so a
# strategic merge patch replaces the whole list (kube-apiserver 1.37.2, 2026-11-26: a patch
# with one driver's entry dropped another driver's); server-side apply is how drivers share it.
CLAIM_DEVICE_KEYS = ("driver", "pool", "device", "shareID")  # one device of a claim (and of its status)
APPLY_LIST_KEYS = {
    ("status", "devices"): CLAIM_DEVICE_KEYS,
}
# Pod-spec lists merge by key wherever a pod spec appears (a Pod, a workload's template).
POD_SPEC_LIST_KEYS = {
    "containers": ("name",),
    "initContainers": ("name",),
    "env": ("name",),
    "volumeMounts": ("mountPath",),
    "volumes": ("name",),
}


def _list_keys(path, apply=False):
    if apply and path in APPLY_LIST_KEYS:
        return APPLY_LIST_KEYS[path]
    if path in STRATEGIC_MERGE_KEYS:
        return STRATEGIC_MERGE_KEYS[path]
    return POD_SPEC_LIST_KEYS.get(path[-1]) if "spec" in path[:-1] else None


def list_item_key(item, key_fields) -> str:
    """The fieldsV1 name of a keyed list's item: k:{"field":value,...} (its key fields set)."""
    return "k:" + json.dumps({f: item[f] for f in key_fields if isinstance(item, dict) and f in item},
                             sort_keys=True, separators=(",", ":"))


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _merge_list(current, patch, key_fields, path, apply=False):
    if not key_fields:  # a set of scalars
        return list(current) + [v for v in patch if v not in current]
    def key(item):
        return tuple(item.get(f) for f in key_fields) if isinstance(item, dict) else None
    result = copy.deepcopy(current)
    for item in patch:
        index = next((i for i, old in enumerate(result) if key(old) == key(item)), None)
        if isinstance(item, dict) and item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(copy.deepcopy(item))
        else:
            result[index] = strategic_merge_patch(result[index], item, path, apply)
    return result


def strategic_merge_patch(target, patch, path=(), apply=False):
    """Merge patch, except that the lists in STRATEGIC_MERGE_KEYS merge by key (and, for a
    server-side apply, those in APPLY_LIST_KEYS)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        field_path = path + (key,)
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(result.get(name), list):
                result[name] = [v for v in result[name] if v not in value]
            continue
        if key.startswith("$"):  # $setElementOrder/ is applied below; $retainKeys: a hint
            continue
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif _list_keys(field_path, apply) is not None and isinstance(value, list) \
                and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, _list_keys(field_path, apply), field_path, apply)
        else:
            result[key] = strategic_merge_patch(result.get(key), value, field_path, apply)
    for key, order in patch.items():
        name = key.removeprefix("$setElementOrder/")
        if name != key and isinstance(result.get(name), list) and isinstance(order, list):
            result[name] = _set_element_order(result[name], order)
    return result


def _set_element_order(items, order):
    """items in the order the patch lists them (by merge key, or value for scalars); items
    it does not list keep their place after them."""
    def matches(item, wanted):
        if isinstance(wanted, dict) and isinstance(item, dict):
            return all(item.get(k) == v for k, v in wanted.items())
        return item == wanted
    ordered = [item for wanted in order for item in items if matches(item, wanted)]
    return ordered + [item for item in items if not any(item is o for o in ordered)]


def _pointer_parts(pointer):
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise bad_request(f"invalid JSON pointer {pointer!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def _list_index(container, part, allow_end):
    if part == "-" and allow_end:
        return len(container)
    if not part.isdigit():
        raise ApiError(422, f"invalid array index {part!r}")
    index = int(part)
    if index > len(container) or (index == len(container) and not allow_end):
        raise ApiError(422, f"array index {index} out of bounds")
    return index


def _parent(doc, parts):
    node = doc
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[_list_index(node, part, allow_end=False)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise ApiError(422, f"doc is missing path: /{'/'.join(parts)}")
    return node


def _get(doc, parts):
    if not parts:
        return doc
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, list):
        return parent[_list_index(parent, last, allow_end=False)]
    if not isinstance(parent, dict) or last not in parent:
        raise ApiError(422, f"doc is missing path: /{'/'.join(parts)}")
    return parent[last]


def _remove(doc, parts):
    value = _get(doc, parts)
    parent = _parent(doc, parts)
    if isinstance(parent, list):
        del parent[int(parts[-1])]
    else:
        del parent[parts[-1]]
    return value


def _add(doc, parts, value):
    if not parts:
        return value
    parent = _parent(doc, parts)
    if isinstance(parent, list):
        parent.insert(_list_index(parent, parts[-1], allow_end=True), value)
    elif isinstance(parent, dict):
        parent[parts[-1]] = value
    else:
        raise ApiError(422, f"doc is missing path: /{'/'.join(parts)}")
    return doc


def json_patch(target, operations):
    if not isinstance(operations, list):
        # What the real server answers when the body is not a JSON array.
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid JSON patch operation: {op!r}")
        kind, parts = op["op"], _pointer_parts(op["path"])
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, parts)
        elif kind == "replace":
            _get(doc, parts)  # must exist
            if parts:
                _remove(doc, parts)
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            from_parts = _pointer_parts(op.get("from", ""))
            value = _remove(doc, from_parts) if kind == "move" else copy.deepcopy(
                _get(doc, from_parts))
            doc = _add(doc, parts, value)
        elif kind == "test":
            if _get(doc, parts) != op.get("value"):
                raise ApiError(422, f"testing value {op['path']} failed")
        else:
            raise bad_request(f"unexpected JSON patch operation {kind!r}")
    return doc


def apply_patch(content_type, target, patch):
    media_type = (content_type or "").split(";")[0].strip().lower()
    if media_type == JSON_PATCH:
        return json_patch(target, patch)
    if media_type in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
        if not isinstance(patch, dict):
            raise bad_request("the body of a merge patch must be a JSON object")
        if media_type == STRATEGIC_MERGE_PATCH:
            return strategic_merge_patch(target, patch)
        return merge_patch(target, patch)
    raise ApiError(415, f"the server does not support patch type {media_type!r}",
                   "UnsupportedMediaType")
