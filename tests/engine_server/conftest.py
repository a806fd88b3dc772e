"""Fixtures that run real `kvfleet engine` processes on 127.0.0.1 (see tests/helpers/procs.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine_fixtures import TINY, TINY_MAX_BODY, ProcessGroup, ServerProcess, start_engine


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessGroup]:
    with ProcessGroup(tmp_path_factory.mktemp("procs")) as group:
        yield group


@pytest.fixture(scope="session")
def shared_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessGroup]:
    with ProcessGroup(tmp_path_factory.mktemp("shared-procs")) as group:
        yield group


@pytest.fixture(scope="session")
def tiny_engine(shared_procs: ProcessGroup) -> ServerProcess:
    """One tiny-random engine for the whole session (tests that do not stop or tune it)."""
    return start_engine(shared_procs, *TINY, "--max-body-bytes", str(TINY_MAX_BODY))
