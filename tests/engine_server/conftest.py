"""Fixtures that run real `kvfleet engine` processes on 127.0.0.1 (see tests/helpers/procs.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine_fixtures import TINY, ProcessGroup, ServerProcess, start_engine


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessGroup]:
    with ProcessGroup(tmp_path_factory.mktemp("procs")) as group:
        yield group


@pytest.fixture(scope="module")
def tiny_engine(procs: ProcessGroup) -> ServerProcess:
    return start_engine(procs, *TINY)
