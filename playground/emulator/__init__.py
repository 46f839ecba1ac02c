"""In-process Kubernetes API emulator speaking the real REST protocol (see ApiEmulator)."""

from .emulator import ApiEmulator
from .requestlog import RequestRecord

__all__ = ["ApiEmulator", "RequestRecord"]
