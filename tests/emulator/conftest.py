"""Fixtures of the emulator tests: a fresh emulator per test (bookmarks every 0.2 s, so the
watch tests see them quickly) and clients of it; the helpers are in tests/support/emulator.py."""

import pytest
from kubernetes import client, dynamic


@pytest.fixture
def emu(make_emulator):
    return make_emulator(bookmark_interval=0.2)


@pytest.fixture
def emu_api(emu):
    """A client of this test's emulator (not the suites' shared `api`)."""
    with emu.api_client() as api_client:
        yield api_client


@pytest.fixture
def core(emu_api):
    return client.CoreV1Api(emu_api)


@pytest.fixture
def resource(emu_api):
    return client.ResourceV1Api(emu_api)


@pytest.fixture
def dyn(emu_api):
    """The dynamic client: sends dicts as they are (no client-side model validation), so
    invalid objects reach the server."""
    return dynamic.DynamicClient(emu_api)
