"""The official CDI JSON schema, vendored in cdi-schema/ (source and licence in its README);
schema.json refers to defs.json by name."""

from __future__ import annotations

import functools
import json
import os

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

SCHEMA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cdi-schema")


@functools.cache
def _validator() -> jsonschema.Draft7Validator:
    def load(name):
        with open(os.path.join(SCHEMA_DIR, name)) as f:
            return json.load(f)

    schema = load("schema.json")
    defs = Resource.from_contents(load("defs.json"), default_specification=DRAFT7)
    registry = Registry().with_resource("defs.json", defs)
    return jsonschema.Draft7Validator(schema, registry=registry)


def assert_valid_cdi(spec: dict) -> None:
    errors = sorted(_validator().iter_errors(spec), key=str)
    assert not errors, "\n".join(e.message for e in errors)
