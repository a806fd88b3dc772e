"""The pure parts of peer prefix fetch on the server: outcomes and the export body."""

from __future__ import annotations

import pytest
from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.core.kv_transfer import KVTransferError
from kvfleet_engine.core.prefix_share import PrefixInstall, PrefixMismatch
from kvfleet_engine.core.sequence import PrefixKV
from kvfleet_engine.server.errors import APIError
from kvfleet_engine.server.kv_export import parse_export_body
from kvfleet_engine.server.peer_fetch import (
    FetchResult,
    failure_outcome,
    installed_outcome,
    record,
)
from kvfleet_engine.server.peer_metrics import PeerPrefixMetrics
from prometheus_client import CollectorRegistry


@pytest.mark.parametrize("exc, want", [
    (PrefixMismatch("x"), "mismatch"),
    (KVTransferError("x", is_timeout=True), "timeout"),
    (KVTransferError("x", status=401), "unauthorized"),
    (KVTransferError("x", status=403), "unauthorized"),
    (KVTransferError("x", status=404), "error"),
    (KVTransferError("x", is_unreachable=True), "unreachable"),
    (KVTransferError("bad magic"), "error"),
])
def test_failure_outcomes(exc, want):
    assert failure_outcome(exc) == want


def test_installed_outcomes():
    fetched = FetchResult(pp.OUTCOME_HIT, PrefixKV([1, 2], b"xx"), num_asked=2)
    assert installed_outcome(fetched, PrefixInstall(2, 0)) == "hit"
    assert installed_outcome(fetched, PrefixInstall(1, 1)) == "hit"
    assert installed_outcome(fetched, PrefixInstall(1, 0)) == "partial"
    assert installed_outcome(fetched, PrefixInstall(is_no_room=True)) == "no_room"
    assert installed_outcome(fetched, PrefixInstall()) == "skipped"
    assert installed_outcome(fetched, None) == "error"
    assert installed_outcome(FetchResult("timeout"), None) == "timeout"


def test_a_timed_out_fetch_records_its_bound_and_no_fetch_time():
    registry = CollectorRegistry()
    metrics = PeerPrefixMetrics(registry, "m")
    timed_out = FetchResult(pp.OUTCOME_TIMEOUT, num_asked=3, timeout_bytes=3 * 4096,
                            timeout_seconds=0.5)
    assert record(metrics, timed_out, None, 16) == pp.OUTCOME_TIMEOUT
    record(metrics, FetchResult(pp.OUTCOME_ERROR, num_asked=3), None, 16)  # no bound

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, {"model_name": "m"})

    assert value(pp.PEER_FETCH_TIMEOUT_BYTES + "_total") == 3 * 4096
    assert value(pp.PEER_FETCH_TIMEOUT_SECONDS + "_total") == 0.5
    assert value(pp.PEER_FETCH_SECONDS + "_count") == 0  # the histogram is completed fetches'


def test_export_body():
    assert parse_export_body({"block_hashes": [0, 5]}) == [0, 5]
    for bad in (None, [], {}, {"block_hashes": []}, {"block_hashes": [-1]},
                {"block_hashes": [1.5]}, {"block_hashes": [False]},
                {"block_hashes": [1] * (pp.MAX_PEER_PREFIX_BLOCKS + 1)}):
        with pytest.raises(APIError) as info:
            parse_export_body(bad)
        assert info.value.status == 400
