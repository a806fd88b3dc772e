"""Local fleets register in a per-user registry (kvfleet status finds them from any
directory); every test, and every `kvfleet up` it starts, gets a private, empty one."""

import pytest


@pytest.fixture(autouse=True)
def private_fleet_registry(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
