"""Object semantics of the generic apiserver registry: defaulting on create, optimistic
concurrency and status subresource rules on update, patch, delete with finalizers."""

import datetime
import random
import uuid

from . import features
from .errors import ApiError, bad_request, conflict, invalid, FieldError
from .patch import apply_patch
from .store import Store

# Name suffix alphabet and length of generateName, as in k8s.io/apiserver (no vowels).
GENERATE_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
GENERATE_NAME_SUFFIX_LENGTH = 5

# What the real create strategies do with a client-supplied status.
STATUS_ON_CREATE = {"ResourceClaim": None, "Pod": {"phase": "Pending"}}

# Metadata that only the server sets; updates keep the stored values.
SERVER_OWNED_METADATA = ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                         "deletionGracePeriodSeconds", "namespace", "name")


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Registry:
    def __init__(self, store: Store, validator, consumable_capacity=True, device_taints=True):
        self.store = store
        self.validator = validator
        self.consumable_capacity = consumable_capacity
        self.device_taints = device_taints

    # --- shared steps -------------------------------------------------------------------

    def _check_type_meta(self, rt, body):
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        for field, expected in (("kind", rt.kind), ("apiVersion", rt.api_version)):
            if body.get(field) not in (None, "", expected):
                raise bad_request(f"{field} {body[field]!r} does not match the expected "
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

    def _finish(self, rt, obj):
        """Drop fields of disabled features, then validate (422 on any problem)."""
        obj = features.drop_disabled_fields(rt, obj, self.consumable_capacity,
                                            self.device_taints)
        errors = self.validator.errors(obj, rt)
        if errors:
            raise invalid(rt, rt.kind, obj["metadata"].get("name", ""), errors)
        return obj

    # --- verbs --------------------------------------------------------------------------

    def create(self, rt, namespace, body, dry_run=False):
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
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            metadata.pop(field, None)
        if rt.kind in STATUS_ON_CREATE:
            obj.pop("status", None)
            if STATUS_ON_CREATE[rt.kind] is not None:
                obj["status"] = dict(STATUS_ON_CREATE[rt.kind])
        obj = self._finish(rt, obj)
        return self.store.create(rt, obj, dry_run=dry_run)

    def _updater(self, rt, namespace, name, make_body, subresource):
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
            sent_rv = metadata.get("resourceVersion")
            if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise conflict(rt, name)
            if subresource == "status":
                # Status writes change status only; everything else stays as stored.
                new = {**old}
                new.pop("status", None)
                if "status" in body:
                    new["status"] = body["status"]
            else:
                new = body
                for field in SERVER_OWNED_METADATA:
                    if field in old["metadata"]:
                        metadata[field] = old["metadata"][field]
                if rt.has_status:  # main resource writes never change status
                    new.pop("status", None)
                    if "status" in old:
                        new["status"] = old["status"]
                if new.get("spec") != old.get("spec"):
                    metadata["generation"] = old["metadata"].get("generation", 1) + 1
            new["metadata"] = {**new["metadata"],
                               "resourceVersion": old["metadata"]["resourceVersion"]}
            new = self._finish(rt, new)
            return old if new == old else new
        return compute

    def update(self, rt, namespace, name, body, subresource=None, dry_run=False):
        compute = self._updater(rt, namespace, name, lambda old: body, subresource)
        return self.store.update(rt, namespace, name, compute, dry_run=dry_run)

    def patch(self, rt, namespace, name, content_type, patch, subresource=None, dry_run=False):
        compute = self._updater(rt, namespace, name,
                                lambda old: apply_patch(content_type, old, patch), subresource)
        return self.store.update(rt, namespace, name, compute, dry_run=dry_run)

    def delete(self, rt, namespace, name, options=None, dry_run=False):
        preconditions = (options or {}).get("preconditions") or {}

        def check(old):
            for field in ("uid", "resourceVersion"):
                wanted = preconditions.get(field)
                if wanted and wanted != old["metadata"].get(field):
                    raise ApiError(409, f'Operation cannot be fulfilled on {rt.qualified_name} '
                                        f'"{name}": Precondition failed: {field} in precondition: '
                                        f'{wanted}, {field} in object meta: '
                                        f'{old["metadata"].get(field)}', "Conflict",
                                   {"name": name, **({"group": rt.group} if rt.group else {}),
                                    "kind": rt.plural})

        def mark_deleted(old):
            return {**old, "metadata": {**old["metadata"], "deletionTimestamp": now_rfc3339(),
                                        "deletionGracePeriodSeconds": 0}}

        return self.store.delete(rt, namespace, name, mark_deleted, check, dry_run=dry_run)

    def delete_collection(self, rt, namespace, selection, dry_run=False):
        items, _ = self.store.list(rt, namespace, selection)
        for obj in items:
            try:
                self.delete(rt, obj["metadata"].get("namespace", ""), obj["metadata"]["name"],
                            dry_run=dry_run)
            except ApiError as error:
                if error.code != 404:  # deleted concurrently: fine
                    raise
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
