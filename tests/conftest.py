"""Session-wide: local fleets register in a per-user registry (kvfleet status finds them from
any directory); every test, and every `kvfleet up` it starts, uses a private one."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_fleet_registry(tmp_path_factory):
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    yield
