"""Shared constants and launchers for engine-server tests (imported by tests and conftest)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # makes tests/helpers importable

from helpers.procs import ProcessGroup, ServerProcess, kvfleet_argv  # noqa: E402

# One torch thread per test engine: the test machine is small and shared.
ENGINE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TINY = ("--model", "tiny-random", "--num-blocks", "256", "--max-model-len", "512")
TINY_MAX_BODY = 8192  # the shared tiny engine's --max-body-bytes


def engine_argv(*extra: str) -> list[str]:
    return kvfleet_argv("engine", "--host", "127.0.0.1", "--port", "{port}", *extra)


def start_engine(procs: ProcessGroup, *extra: str,
                 env: dict[str, str] | None = None) -> ServerProcess:
    return procs.start(engine_argv(*extra), env={**ENGINE_ENV, **(env or {})})
