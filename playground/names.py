"""Kubernetes name grammars (k8s.io/apimachinery/pkg/util/validation) and resource name kinds
(k8s.io/kubernetes pkg/apis/core/v1/helper), for the emulator's validation and the scheduler."""

import re

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # fullmatch only
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")  # fullmatch only
QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")  # the part after a prefix/
DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"  # resourceapi.ResourceDeviceClassPrefix


def is_extended_resource_name(name: str) -> bool:
    """v1helper.IsExtendedResourceName: a domain-prefixed name outside kubernetes.io whose quota
    name `requests.<name>` is a qualified name."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    prefix, _, short = f"requests.{name}".rpartition("/")
    return len(prefix) <= 253 and bool(DNS_SUBDOMAIN.fullmatch(prefix)) and bool(QUALIFIED_NAME.fullmatch(short))


def is_dra_extended_resource_name(name: str) -> bool:
    """schedutil.IsDRAExtendedResourceName: an extended resource, or a DeviceClass's implicit name."""
    return is_extended_resource_name(name) or name.startswith(DEVICE_CLASS_PREFIX)
