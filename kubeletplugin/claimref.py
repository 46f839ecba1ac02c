"""What the kubelet names a claim by, checked before any of it reaches a path or a URL.

The claim UID becomes part of file names (state dir, CDI spec): it must be a UID, so no
`/`, `..`, NUL or over-long value can ever point outside those folders.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Whole-string patterns: use them only through fullmatch (`$` would let "...\n" through).
UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # namespace, <= 63
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")  # name, <= 253


class ClaimError(Exception):
    """This claim cannot be prepared or unprepared; the message goes back to the kubelet.

    `reason` is a short word for the errors metric (claim_not_found, uid_mismatch, io, ...).
    """

    def __init__(self, message: str, reason: str = "invalid_claim") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


def is_uid(value: str) -> bool:
    return bool(UID.fullmatch(value))


def is_namespace(value: str) -> bool:
    return len(value) <= 63 and bool(DNS_LABEL.fullmatch(value))


def is_name(value: str) -> bool:
    return len(value) <= 253 and bool(DNS_SUBDOMAIN.fullmatch(value))


def check_uid(uid: str, field: str = "uid") -> str:
    if not isinstance(uid, str) or not is_uid(uid):
        raise ClaimError(f"{field}: not a UID (36 lowercase hex digits and dashes) (got {uid[:80]!r})")
    return uid


def check_ref(namespace: str, name: str, uid: str) -> ClaimRef:
    check_uid(uid, "claim uid")
    if not is_namespace(namespace):
        raise ClaimError(f"claim namespace: not a DNS label of at most 63 characters (got {namespace[:80]!r})")
    if not is_name(name):
        raise ClaimError(f"claim name: not a DNS subdomain of at most 253 characters (got {name[:80]!r})")
    return ClaimRef(namespace, name, uid)
