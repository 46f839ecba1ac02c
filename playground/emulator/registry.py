"""Object semantics of the generic apiserver registry: defaulting on create, optimistic
concurrency and status subresource rules on update, patch, delete with finalizers."""

import copy
import datetime
import random
import uuid
from dataclasses import dataclass, field

from playground.emulator import admission, features

from .errors import ApiError, FieldError, bad_request, conflict, invalid
from .patch import APPLY_LIST_KEYS, APPLY_PATCH, apply_patch, list_item_key, strategic_merge_patch
from .resources import BY_PATH, RESOURCE_TYPES
from .selectors import Selection
from .store import Store
from .validation import allocated_device_ids, claim_device_id, field_path

# Name suffix alphabet and length of generateName, as in k8s.io/apiserver (no vowels).
GENERATE_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
GENERATE_NAME_SUFFIX_LENGTH = 5

# What the real create strategies do with a client-supplied status.
STATUS_ON_CREATE = {"ResourceClaim": None, "Pod": {"phase": "Pending"},
                    "Namespace": {"phase": "Active"}}

# Metadata that only the server sets; updates keep the stored values.
SERVER_OWNED_METADATA = ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                         "deletionGracePeriodSeconds", "namespace", "name")

# Kinds whose spec cannot change after create (the real update validation refuses it).
IMMUTABLE_SPEC = ("ResourceClaim", "ResourceClaimTemplate")
# Where validating admission finds its policies and their bindings.
POLICIES = BY_PATH[(admission.POLICY_GROUP, "v1", "validatingadmissionpolicies")]
BINDINGS = BY_PATH[(admission.POLICY_GROUP, "v1", "validatingadmissionpolicybindings")]
FIELD_VALIDATION = ("Ignore", "Warn", "Strict")


@dataclass
class Write:
    """How one write request asks to be handled, and the warnings it collects for the client."""
    dry_run: bool = False
    field_validation: str = "Warn"  # the real server's default when the request names none
    field_manager: str = ""
    warnings: list = field(default_factory=list)
    created: bool = False  # set by an apply that created the object

    def __post_init__(self):
        if self.field_validation not in FIELD_VALIDATION:
            raise bad_request(f'fieldValidation parameter {self.field_validation!r} is not '
                              f'supported: use one of "Ignore", "Warn" or "Strict"')


def default_requests_from_limits(pod):
    """A container's limits are its requests where it names none (k8s.io/kubernetes
    pkg/apis/core/v1/defaults.go, SetDefaults_Pod): the scheduler reads requests."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = (container or {}).get("resources") or {}
        if isinstance(resources.get("limits"), dict):
            resources["requests"] = {**resources["limits"], **(resources.get("requests") or {})}


def _child(node, part):
    """node[part]; a keyed list's item where part is ("k", its fieldsV1 key)."""
    if isinstance(part, tuple):
        keys = next(k for p, k in APPLY_LIST_KEYS.items() if p[-1] == part[2])
        for item in node:
            if list_item_key(item, keys) == part[1]:
                return item
        raise KeyError(part[1])
    return node[part]


def _parent(obj, path):
    """The dict or list that holds the value at path."""
    node = obj
    for part in path[:-1]:
        node = _child(node, part)
    return node


def _set_path(obj, path, value):
    _parent(obj, path)[path[-1]] = value


def _drop_path(obj, path):
    parent, last = _parent(obj, path), path[-1]
    if isinstance(last, tuple):
        parent.remove(_child(parent, last))
    else:
        del parent[last]


def drop_deallocated_status_devices(new, old):
    """A ResourceClaim status write drops the status.devices entries of devices the old
    allocation held and the new one does not (dropDeallocatedStatusDevices,
    pkg/registry/resource/resourceclaim/strategy.go): deallocating clears them."""
    gone = allocated_device_ids(old) - allocated_device_ids(new)
    status = new.get("status") or {}
    if gone and status.get("devices"):
        new["status"] = {**status, "devices": [d for d in status["devices"] if claim_device_id(d) not in gone]}


def managed_fields(obj, path=()):
    """fieldsV1 of an applied configuration: every field it sets; the items of a keyed list
    (APPLY_LIST_KEYS) each under its key, other lists atomic."""
    if isinstance(obj, list) and path in APPLY_LIST_KEYS:
        return {list_item_key(item, APPLY_LIST_KEYS[path]): managed_fields(item, path + ("*",)) for item in obj}
    if not isinstance(obj, dict):
        return {}
    return {f"f:{k}": managed_fields(v, path + (k,)) for k, v in obj.items()
            if k not in ("apiVersion", "kind") and not (k == "metadata" and v is None)}


def _paths(fields, prefix=()):
    """The paths of a fieldsV1: a field by its name, a keyed list's item as ("k", key, list)."""
    for key, sub in fields.items():
        path = prefix + ((("k", key, prefix[-1]),) if key.startswith("k:") else (key[2:],))
        yield path
        yield from _paths(sub, path)


def now_rfc3339():
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Registry:
    def __init__(self, store: Store, validator, gates: dict[str, bool]):
        self.store = store
        self.validator = validator
        self.gates = gates  # feature gate -> on (features.py)

    # --- shared steps -------------------------------------------------------------------

    def _check_type_meta(self, rt, body):
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        for key, expected in (("kind", rt.kind), ("apiVersion", rt.api_version)):
            if body.get(key) not in (None, "", expected):
                raise bad_request(f"{key} {body[key]!r} does not match the expected "
                                  f"{expected!r}")
        body = {**body, "apiVersion": rt.api_version, "kind": rt.kind}
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise bad_request("metadata must be an object")
        body["metadata"] = dict(metadata or {})
        return body

    def _check_namespace(self, rt, namespace, body):
        metadata = body["metadata"]
        if not rt.namespaced:
            metadata.pop("namespace", None)
            return
        if metadata.get("namespace") and metadata["namespace"] != namespace:
            raise bad_request("the namespace of the provided object does not match the "
                              "namespace sent on the request")
        metadata["namespace"] = namespace

    def _decode(self, rt, obj, write):
        """Unknown fields as the request's fieldValidation asks: refused (Strict, 400),
        dropped with a warning (Warn) or dropped silently (Ignore); quantities stored in the
        real server's canonical form."""
        unknown, canonical = self.validator.decode(obj, rt)
        if unknown:
            names = [f'unknown field "{field_path(p)}"' for p in unknown]
            if write.field_validation == "Strict":
                raise bad_request("strict decoding error: " + ", ".join(names))
            if write.field_validation == "Warn":
                write.warnings.extend(names)
        if not unknown and not canonical:
            return obj
        obj = copy.deepcopy(obj)
        for path, text in canonical:
            _set_path(obj, path, text)
        for path in sorted(unknown, key=len, reverse=True):
            _drop_path(obj, path)
        return obj

    def _finish(self, rt, obj, write):
        """Decode (unknown fields, quantities), drop fields of disabled features, then
        validate (422 on any problem)."""
        obj = self._decode(rt, obj, write)
        obj = features.drop_disabled_fields(rt, obj, self.gates)
        errors = self.validator.errors(obj, rt)
        if errors:
            raise invalid(rt, rt.kind, obj["metadata"].get("name", ""), errors)
        return obj

    def _admit(self, rt, operation, obj, old, subresource, write):
        """Validating admission, after the object validated (as on the real server)."""
        policies = self.store.all(POLICIES)
        if not policies:
            return
        metadata = obj["metadata"]
        request = admission.request_attributes(
            rt.group, rt.version, rt.plural, rt.kind, operation, metadata.get("namespace", ""),
            metadata.get("name", ""), subresource or "", write.dry_run)
        admission.admit(policies, self.store.all(BINDINGS), obj, old, request, write.warnings, self._param)

    def _param(self, api_version, kind, namespace, name):
        """A policy binding's param object (paramKind and paramRef), or None."""
        rt = next((r for r in RESOURCE_TYPES if r.api_version == api_version and r.kind == kind), None)
        if rt is None:
            return None
        objects = self.store.all(rt)
        return next((o for o in objects if o["metadata"]["name"] == name
                     and o["metadata"].get("namespace", "") == (namespace if rt.namespaced else "")), None)

    # --- verbs --------------------------------------------------------------------------

    def create(self, rt, namespace, body, write=None):
        write = write or Write()
        obj = self._check_type_meta(rt, body)
        self._check_namespace(rt, namespace, obj)
        metadata = obj["metadata"]
        if metadata.get("resourceVersion"):
            raise ApiError(500, "resourceVersion should not be set on objects to be created")
        if not metadata.get("name"):
            if not metadata.get("generateName"):
                raise invalid(rt, rt.kind, "", [FieldError(
                    "metadata.name", "Required", "name or generateName is required")])
            suffix = "".join(random.choice(GENERATE_NAME_ALPHABET)
                             for _ in range(GENERATE_NAME_SUFFIX_LENGTH))
            metadata["name"] = metadata["generateName"] + suffix
        metadata.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            metadata.pop(key, None)
        if rt.kind in STATUS_ON_CREATE:
            obj.pop("status", None)
            status = STATUS_ON_CREATE[rt.kind]
            if status is not None:
                obj["status"] = dict(status)
        if rt.kind == "Pod":
            default_requests_from_limits(obj)
        obj = self._finish(rt, obj, write)
        self._admit(rt, "CREATE", obj, None, None, write)
        return self.store.create(rt, obj, dry_run=write.dry_run)

    def _updater(self, rt, namespace, name, make_body, subresource, write):
        """compute(old) for Store.update: builds the new object from make_body(old)."""
        def compute(old):
            body = self._check_type_meta(rt, make_body(old))
            metadata = body["metadata"]
            if metadata.get("name", name) != name:
                raise bad_request(f"the name of the object ({metadata['name']}) does not match "
                                  f"the name on the URL ({name})")
            if rt.namespaced and metadata.get("namespace", namespace) != namespace:
                raise bad_request("the namespace of the provided object does not match the "
                                  "namespace sent on the request")
            if metadata.get("uid") and metadata["uid"] != old["metadata"]["uid"]:  # a recreated object
                raise invalid(rt, rt.kind, name, [FieldError("metadata.uid", "Invalid", "field is immutable",
                                                             metadata["uid"], True)])
            sent_rv = metadata.get("resourceVersion")
            if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise conflict(rt, name)
            if subresource == "status":
                # Status writes change status only; everything else stays as stored.
                new = {**old}
                new.pop("status", None)
                if "status" in body:
                    new["status"] = body["status"]
                if "managedFields" in metadata:  # who applied which status fields (Registry.apply)
                    new["metadata"] = {**old["metadata"], "managedFields": metadata["managedFields"]}
                if rt.kind == "ResourceClaim":
                    drop_deallocated_status_devices(new, old)
            else:
                new = body
                for name_ in SERVER_OWNED_METADATA:
                    if name_ in old["metadata"]:
                        metadata[name_] = old["metadata"][name_]
                if "managedFields" not in metadata and "managedFields" in old["metadata"]:
                    metadata["managedFields"] = old["metadata"]["managedFields"]
                if rt.has_status:  # main resource writes never change status
                    new.pop("status", None)
                    if "status" in old:
                        new["status"] = old["status"]
                if new.get("spec") != old.get("spec"):
                    metadata["generation"] = old["metadata"].get("generation", 1) + 1
            new["metadata"] = {**new["metadata"],
                               "resourceVersion": old["metadata"]["resourceVersion"]}
            new = self._finish(rt, new, write)
            if rt.kind in IMMUTABLE_SPEC and subresource is None \
                    and new.get("spec") != old.get("spec"):
                raise invalid(rt, rt.kind, name, [FieldError("spec", "Invalid",
                                                             "field is immutable")])
            self._admit(rt, "UPDATE", new, old, subresource, write)  # no-op updates too
            return old if new == old else new
        return compute

    def update(self, rt, namespace, name, body, subresource=None, write=None):
        write = write or Write()
        compute = self._updater(rt, namespace, name, lambda old: body, subresource, write)
        return self._gone_after(rt, self.store.update(rt, namespace, name, compute,
                                                      dry_run=write.dry_run), write)

    def bind(self, rt, namespace, name, binding, write=None):
        """POST pods/NAME/binding, as the scheduler binds: spec.nodeName and a PodScheduled
        condition, once (k8s.io/kubernetes pkg/registry/core/pod/storage/storage.go, assignPod)."""
        write = write or Write()
        target = (binding or {}).get("target") or {}
        if target.get("kind", "Node") not in ("", "Node") or not target.get("name"):
            raise invalid(rt, "Binding", name, [FieldError("target", "Invalid", f"must name a Node, not {target}")])

        def compute(old):
            node = (old.get("spec") or {}).get("nodeName")
            if node:
                raise ApiError(409, f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is '
                                    f'already assigned to node "{node}"', "Conflict",
                               {"name": name, "kind": "pods/binding"})
            new = copy.deepcopy(old)
            new["spec"]["nodeName"] = target["name"]
            status = new.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            status["conditions"] = [*conditions, {"type": "PodScheduled", "status": "True",
                                                  "lastTransitionTime": now_rfc3339()}]
            return new

        self.store.update(rt, namespace, name, compute, dry_run=write.dry_run)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _gone_after(self, rt, result, write):
        """An update that removed the last finalizer of a deleted object deleted it: its
        dependents are collected as after a delete."""
        metadata = result["metadata"]
        if not write.dry_run and metadata.get("deletionTimestamp") and \
                not self.store.exists(rt, metadata.get("namespace", ""), metadata["name"]):
            self.collect_garbage(metadata["uid"])
        return result

    def patch(self, rt, namespace, name, content_type, patch, subresource=None, write=None):
        write = write or Write()
        if (content_type or "").split(";")[0].strip().lower() == APPLY_PATCH:
            return self.apply(rt, namespace, name, patch, subresource, write)
        compute = self._updater(rt, namespace, name,
                                lambda old: apply_patch(content_type, old, patch), subresource,
                                write)
        return self._gone_after(rt, self.store.update(rt, namespace, name, compute,
                                                      dry_run=write.dry_run), write)

    def apply(self, rt, namespace, name, applied, subresource, write):
        """Server-side apply, simply: the applied configuration is merged into the object
        (created when missing); fields this manager applied before and no longer applies,
        and no other manager applied, are removed. No conflict detection."""
        if not write.field_manager:
            raise bad_request("PATCH /apply requests require fieldManager")
        if not isinstance(applied, dict):
            raise bad_request("the body of an apply patch must be a YAML or JSON object")
        applied = self._check_type_meta(rt, applied)
        fields = managed_fields({k: v for k, v in applied.items()
                                 if k != "status" or subresource == "status"})
        entry = {"manager": write.field_manager, "operation": "Apply",
                 "apiVersion": rt.api_version, "time": now_rfc3339(), "fieldsType": "FieldsV1",
                 "fieldsV1": fields, **({"subresource": subresource} if subresource else {})}
        if self.store.exists(rt, namespace, name) or subresource:
            def make_body(old):
                mine = [m for m in old["metadata"].get("managedFields") or []
                        if (m.get("manager"), m.get("operation"), m.get("subresource")) ==
                        (write.field_manager, "Apply", subresource)]
                others = [m for m in old["metadata"].get("managedFields") or [] if m not in mine]
                body = strategic_merge_patch(old, applied, apply=True)
                kept = set(_paths(fields)).union(
                    *(_paths(m.get("fieldsV1") or {}) for m in others))
                dropped = set(_paths(mine[0].get("fieldsV1") or {}) if mine else ()) - kept
                for path in sorted(dropped, key=len):
                    try:
                        _drop_path(body, path)
                    except (KeyError, TypeError, IndexError):  # went with its parent
                        pass
                unchanged = mine and mine[0].get("fieldsV1") == fields
                # The same fields again keep their entry (and time): a no-op apply writes nothing.
                body["metadata"]["managedFields"] = others + [mine[0] if unchanged else entry]
                return body
            compute = self._updater(rt, namespace, name, make_body, subresource, write)
            return self.store.update(rt, namespace, name, compute, dry_run=write.dry_run)
        if applied["metadata"].get("name", name) != name:
            raise bad_request(f"the name of the object ({applied['metadata']['name']}) does "
                              f"not match the name on the URL ({name})")
        applied["metadata"] = {**applied["metadata"], "name": name, "managedFields": [entry]}
        created = self.create(rt, namespace, applied, write)
        write.created = True
        return created

    def delete(self, rt, namespace, name, options=None, write=None):
        write = write or Write()
        dry_run = write.dry_run
        preconditions = (options or {}).get("preconditions") or {}

        def check(old):
            for key in ("uid", "resourceVersion"):
                wanted = preconditions.get(key)
                if wanted and wanted != old["metadata"].get(key):
                    raise ApiError(409, f'Operation cannot be fulfilled on {rt.qualified_name} '
                                        f'"{name}": Precondition failed: {key} in precondition: '
                                        f'{wanted}, {key} in object meta: '
                                        f'{old["metadata"].get(key)}', "Conflict",
                                   {"name": name, **({"group": rt.group} if rt.group else {}),
                                    "kind": rt.plural})

        def mark_deleted(old):
            return {**old, "metadata": {**old["metadata"], "deletionTimestamp": now_rfc3339(),
                                        "deletionGracePeriodSeconds": 0}}

        result = self.store.delete(rt, namespace, name, mark_deleted, check, dry_run=dry_run)
        if rt.kind == "Namespace" and rt.group == "" and not dry_run:
            # What the namespace controller does: everything in the namespace goes with it.
            for contained in RESOURCE_TYPES:
                if contained.namespaced:
                    self.delete_collection(contained, name, Selection(contained, "", ""))
        if not dry_run and not self.store.exists(rt, namespace, name):
            self.collect_garbage(result["metadata"]["uid"],
                                 orphan=(options or {}).get("propagationPolicy") == "Orphan")
        return result

    def collect_garbage(self, owner_uid, orphan=False):
        """What the garbage collector does once an owner is gone: each dependent loses its
        reference to it, and a dependent left with no owner is deleted (orphan: kept)."""
        for rt in RESOURCE_TYPES:
            for obj in self.store.all(rt):
                refs = obj["metadata"].get("ownerReferences") or []
                if not any(r.get("uid") == owner_uid for r in refs):
                    continue
                namespace, name = obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
                left = [r for r in refs if r.get("uid") != owner_uid]
                try:
                    if left or orphan:
                        self.patch(rt, namespace, name, "application/merge-patch+json",
                                   {"metadata": {"ownerReferences": left or None}})
                    else:
                        self.delete(rt, namespace, name)
                except ApiError as error:
                    if error.code != 404:  # already gone: fine
                        raise

    def delete_collection(self, rt, namespace, selection, write=None):
        items, _ = self.store.list(rt, namespace, selection)
        for obj in items:
            try:
                self.delete(rt, obj["metadata"].get("namespace", ""), obj["metadata"]["name"],
                            write=write)
            except ApiError as error:
                if error.code != 404:  # deleted concurrently: fine
                    raise
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
