"""Fixtures that run real `kvfleet engine` processes on 127.0.0.1 (see tests/helpers/procs.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers

from helpers.procs import ProcessGroup, ServerProcess, kvfleet_argv  # noqa: E402

# One torch thread per test engine: the test machine is small and shared.
ENGINE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TINY = ("--model", "tiny-random", "--num-blocks", "256", "--max-model-len", "512")


def engine_argv(*extra: str) -> list[str]:
    return kvfleet_argv("engine", "--host", "127.0.0.1", "--port", "{port}", *extra)


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessGroup]:
    with ProcessGroup(tmp_path_factory.mktemp("procs")) as group:
        yield group


def start_engine(procs: ProcessGroup, *extra: str) -> ServerProcess:
    return procs.start(engine_argv(*extra), env=ENGINE_ENV)


@pytest.fixture(scope="module")
def tiny_engine(procs: ProcessGroup) -> ServerProcess:
    return start_engine(procs, *TINY)
