"""Fixtures of the hook tests; they and the helpers live in hooktest.py."""
from .hooktest import asan_build, build, make_claim  # noqa: F401 (fixtures)
