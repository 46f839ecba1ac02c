"""CDI spec files on disk: ours (one file per spec name) and other vendors' (read only).

Our file names follow the CDI convention `<vendor>-<class>_<name>.json`; JSON is valid YAML,
so every CDI consumer reads it, and it is written exactly (no YAML quoting surprises).
"""

from __future__ import annotations

import json
import os
import threading

import yaml

from .atomic import remove_durable, write_atomic
from .spec import Spec

SPEC_EXTENSIONS = (".json", ".yaml", ".yml")


class SpecDir:
    """The spec files of one CDI kind in one folder (the runtime's CDI root)."""

    def __init__(self, root: str, kind: str):
        self.root = root
        self.kind = kind
        self.prefix = kind.replace("/", "-") + "_"  # k8s.gpushare.dev/claim -> k8s.gpushare.dev-claim_

    def path(self, name: str) -> str:
        return os.path.join(self.root, f"{self.prefix}{name}.json")

    def write(self, name: str, spec: Spec) -> str:
        os.makedirs(self.root, mode=0o755, exist_ok=True)
        path = self.path(name)
        write_atomic(path, json.dumps(spec.to_dict(), indent=2).encode() + b"\n", mode=0o644)
        for ext in SPEC_EXTENSIONS[1:]:  # an older release's .yaml would define the devices twice
            remove_durable(os.path.join(self.root, f"{self.prefix}{name}{ext}"))
        return path

    def exists(self, name: str) -> bool:
        return os.path.exists(self.path(name))

    def remove(self, name: str) -> bool:
        """Remove the spec (any extension we or an older release wrote); False when absent."""
        removed = False
        for ext in SPEC_EXTENSIONS:
            removed |= remove_durable(os.path.join(self.root, f"{self.prefix}{name}{ext}"))
        return removed

    def names(self) -> set[str]:
        """Names of the specs of our kind in this folder."""
        try:
            entries = os.listdir(self.root)
        except FileNotFoundError:
            return set()
        return {e[len(self.prefix):].rsplit(".", 1)[0] for e in entries
                if e.startswith(self.prefix) and e.endswith(SPEC_EXTENSIONS)}


# (path, mtime_ns, size) -> (kind, device names); other vendors' specs change rarely.
_cache: dict[tuple[str, int, int], tuple[str, frozenset[str]]] = {}
_cache_lock = threading.Lock()


def find_devices_of_kind(roots: list[str], kind: str, skip_prefix: str = "") -> set[str]:
    """Device names of every spec of `kind` in `roots` (e.g. nvidia.com/gpu from the toolkit).

    Unreadable or malformed files are skipped: another vendor's broken spec must not stop
    us from preparing claims.
    """
    found: set[str] = set()
    for root in dict.fromkeys(roots):
        try:
            entries = sorted(os.listdir(root))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            if (skip_prefix and entry.startswith(skip_prefix)) or not entry.endswith(SPEC_EXTENSIONS):
                continue
            spec_kind, names = _read_kind(os.path.join(root, entry))
            if spec_kind == kind:
                found |= names
    return found


def _read_kind(path: str) -> tuple[str, frozenset[str]]:
    try:
        st = os.stat(path)
    except OSError:
        return "", frozenset()
    key = (path, st.st_mtime_ns, st.st_size)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    try:
        with open(path, "rb") as f:
            doc = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        kind = doc.get("kind", "") if isinstance(doc, dict) else ""
        names = frozenset(d["name"] for d in doc.get("devices") or [] if isinstance(d, dict) and "name" in d)
        result = (kind if isinstance(kind, str) else "", names)
    except (OSError, yaml.YAMLError, AttributeError, TypeError):
        result = ("", frozenset())
    with _cache_lock:
        _cache[key] = result
    return result
