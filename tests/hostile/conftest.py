"""pytest fixtures for the hostile corpus; the launchers live in hostile_fleet.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hostile_fleet import ProcessGroup


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessGroup]:
    with ProcessGroup(tmp_path_factory.mktemp("hostile")) as group:
        yield group
