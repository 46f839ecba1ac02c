"""Fixtures of the emulator tests; they and the body helpers live in emutest.py."""
from .emutest import api, core, dyn, emu, resource  # noqa: F401 (fixtures)
