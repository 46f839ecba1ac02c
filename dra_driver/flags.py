"""Command-line values that need more than argparse's `choices`: parsed and checked in one place.

The rule for every command-line error (README.md, "Command-line errors"): one human line
on stderr naming the flag, the value and what is accepted, exit status 2, and nothing started
or left behind. The argparse `type=` functions here raise `argparse.ArgumentTypeError`; checks
that need the machine (is the port free?) raise `FlagError`, which the CLI prints the same way.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import socket
import urllib.parse
from collections.abc import Callable
from dataclasses import fields
from typing import Literal, Self

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[^:\[\]/\s]*):(?P<port>[^:]*)$")
HOST_PORT_ACCEPTED = "accepted: HOST:PORT such as :9400, 127.0.0.1:9400 or [::1]:9400; empty disables"
URL_ACCEPTED = "accepted: HOST:PORT such as 127.0.0.1:9400, or a URL such as http://HOST:PORT/metrics"
XID_MAX = 2**32 - 1
XIDS_ACCEPTED = f"accepted: XID numbers 0..{XID_MAX} separated by commas such as 63,92, or all alone; empty adds none"


class FromArgs:
    """A command's typed, frozen Config (a dataclass) built from its parsed flags in one step:
    each field from the flag of the same name. A field that must hold with others (one flag
    only with another) is checked in the Config's __post_init__, raising FlagError."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Self:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})  # type: ignore[arg-type]


class StartupError(Exception):
    """A command cannot start (bad flag, no GPUs, no cluster config, native files missing).

    The CLI prints it as one line. Each module's error subclasses it, so the CLI catches them
    all without importing those modules (share-agent must not need the kubernetes client).
    """


class FlagError(StartupError, ValueError):
    """A flag value the process cannot start with; str() is '--flag: what is wrong'."""

    def __init__(self, flag: str, problem: str):
        super().__init__(f"{flag}: {problem}")


def _port_number(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) <= 65535 else None


def port(text: str) -> int:
    """argparse type: a TCP port, 0..65535 (what 0 means is the flag's own help)."""
    value = _port_number(text.strip())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (accepted: 0..65535)")
    return value


_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def pod_uid(text: str) -> str:
    """argparse type: a pod's metadata.uid (it goes into socket names), or empty."""
    value = text.strip()
    if value and not _POD_UID.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a pod UID (accepted: the pod's metadata.uid such as "
                                         "0f8e3c2a-5b1d-4e7f-9a6c-2d4b8e1f3a5c, from the downward API; "
                                         "empty turns rolling updates off)")
    return value


def split_host_port(text: str) -> tuple[str, int]:
    """':9400' -> ('', 9400); '[::1]:9400' -> ('::1', 9400); ValueError when malformed."""
    m = _HOST_PORT.match(text.strip())
    value = _port_number(m.group("port")) if m else None
    if m is None or value is None:
        raise ValueError(text)
    return m.group("host").strip("[]"), value


def host_port(text: str) -> str:
    """argparse type: HOST:PORT or empty (disabled); the text is kept as given."""
    if text.strip():
        try:
            split_host_port(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT ({HOST_PORT_ACCEPTED})") from None
    return text.strip()


def metrics_url(text: str) -> str:
    """argparse type: the plugin's metrics endpoint. `host:port` gets http:// and /metrics added
    (`:9400` is this host); a URL without a path gets /metrics."""
    raw = text.strip()
    if "://" not in raw:
        try:
            host, port_number = split_host_port(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a metrics URL ({URL_ACCEPTED})") from None
        raw = f"http://{_join(host or '127.0.0.1', port_number)}"
    try:
        url = urllib.parse.urlsplit(raw)
        url.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not a metrics URL ({URL_ACCEPTED})")
    return urllib.parse.urlunsplit(url._replace(path=url.path if url.path not in ("", "/") else "/metrics"))


def xid_list(text: str) -> frozenset[int] | Literal["all"]:
    """argparse type: XIDs the GPU health monitor ignores besides the application ones; "all"
    ignores every XID. Spaces around items are dropped (an env var or YAML list often has them)."""
    if text.strip() == "all":
        return "all"
    if not text.strip():
        return frozenset()
    items = [item.strip() for item in text.split(",")]
    for item in items:
        # ASCII digits only: str.isdigit() also takes other scripts' digits, and int() reads them.
        if not (item.isascii() and item.isdigit() and int(item) <= XID_MAX):
            where = repr(text) if len(items) == 1 else f"{item!r} in {text!r}"
            raise argparse.ArgumentTypeError(f"{where} is not an XID ({XIDS_ACCEPTED})")
    return frozenset(int(item) for item in items)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be greater than zero")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{value} must be zero or more")
    return value


def namespaced_name(text: str) -> str:
    """argparse type: NAMESPACE/NAME."""
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAMESPACE/NAME")
    return text


def existing_file(text: str) -> str:
    """argparse type: a file that exists now (a kubeconfig)."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text!r} does not exist or is not a file (accepted: a kubeconfig file "
                                         "path; leave it unset inside a pod)")
    return text


def _join(host: str, port_number: int) -> str:
    return f"[{host}]:{port_number}" if ":" in host else f"{host}:{port_number}"


def check_port_free(flag: str, host: str, port_number: int, zero: str = "0 for any free one") -> None:
    """Refuse, before anything binds, a port another process already listens on; host '' is every
    address. Port 0 (any port, or the flag's 'disabled') is never taken; `zero` says what it means."""
    if port_number == 0:
        return
    where = _join(host, port_number) if host else f"port {port_number}"
    try:
        infos = socket.getaddrinfo(host or None, port_number, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise FlagError(flag, f"cannot listen on {where}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        # SO_REUSEADDR as the servers set it: a port only in TIME_WAIT after a restart is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
            s.listen()
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise FlagError(flag, f"{where} is already in use by another process (accepted: a free port, "
                                      f"or {zero})") from None
            raise FlagError(flag, f"cannot listen on {where}: {e.strerror}") from None


def gpu_list(parse: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type for a GPU list flag (--mps-gpus, --mig-gpus): checked by `parse` here, so a
    bad value is a usage error naming the flag once (`parse`'s message names only the value); the
    text itself is kept."""
    def check(text: str) -> str:
        try:
            parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text
    return check
