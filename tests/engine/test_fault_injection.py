"""--fault-error-rate: a share of completions answered 500, evenly spread and exact (the
rollout tests' bad revision)."""

from __future__ import annotations

import pytest
from kvfleet_engine.server.errors import APIError
from kvfleet_engine.server.state import ServerSettings, ServerState


def failures(rate: float, n: int) -> list[int]:
    state = ServerState(ServerSettings(["m"], 64, 32, fault_error_rate=rate), tokenizer=None)
    out = []
    for i in range(n):
        try:
            state.inject_fault()
        except APIError as exc:
            assert exc.status == 500 and exc.code == "injected_fault"
            out.append(i)
    return out


@pytest.mark.parametrize(("rate", "n", "want"), [(0.0, 100, 0), (0.3, 100, 30), (0.25, 7, 1),
                                                 (1.0, 5, 5), (0.01, 99, 0), (0.01, 100, 1)])
def test_the_share_of_failures_is_exact_over_any_run(rate: float, n: int, want: int) -> None:
    assert len(failures(rate, n)) == want


def test_failures_are_spread_not_bunched() -> None:
    assert failures(0.25, 12) == [3, 7, 11]
