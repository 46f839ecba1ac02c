"""CDI specs in the tests: the claim's spec file checked against the official CDI schema, and
podman run against a test's own CDI folder as if it were /var/run/cdi.

The schema is vendored in cdi-schema/ (source and licence in its README); schema.json refers
to defs.json by name.

podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi. Instead of writing into the
host's /var/run/cdi (shared with every other test and plugin on the machine), the command
runs in a private mount namespace where the test's folder is bind-mounted over it: podman's
own CDI loader then reads exactly that folder, leftovers of a crash included.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import subprocess
from collections import Counter

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

SCHEMA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cdi-schema")
HOST_CDI_ROOT = os.path.realpath("/var/run/cdi")
CDI_EXTENSIONS = (".json", ".yaml")  # what container-device-interface's scanSpecDirs loads


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


def spec_path(dirs, uid, cdi_root=None):
    return os.path.join(cdi_root or dirs.cdi, f"k8s.gpushare.dev-claim_{uid}.json")


def load_spec(dirs, uid, cdi_root=None):
    """The claim's spec, checked against the official CDI schema."""
    with open(spec_path(dirs, uid, cdi_root)) as f:
        spec = json.load(f)
    assert_valid_cdi(spec)
    return spec


def podman_run(runner, cdi_root: str, device_ids: list[str], argv: list[str],
               options: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`podman run [options] --device ... argv` seeing `cdi_root` as /var/run/cdi."""
    os.makedirs(HOST_CDI_ROOT, exist_ok=True)  # the mount point
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    podman = runner.command(device_ids, argv)
    podman[2:2] = options  # after `podman run`
    cmd = ["unshare", "--mount", "--", "sh", "-c", script, "sh", cdi_root, HOST_CDI_ROOT, *podman]
    return subprocess.run(cmd, env=runner.env, capture_output=True, text=True, timeout=180)


def duplicate_devices(cdi_root: str) -> list[str]:
    """Qualified device names (`kind=name`) defined by more than one file a CDI loader reads."""
    names = Counter()
    for path in glob.glob(os.path.join(cdi_root, ".*")) + glob.glob(os.path.join(cdi_root, "*")):
        if path.endswith(CDI_EXTENSIONS):
            with open(path) as f:
                spec = json.load(f)
            names.update(f"{spec['kind']}={d['name']}" for d in spec["devices"])
    return [name for name, n in names.items() if n > 1]


def env_of(spec: dict) -> dict[str, str]:
    """A CDI spec's spec-level environment as a dict."""
    return dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
