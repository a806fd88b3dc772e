"""The peer-prefix hint (what a router attaches) and the fetch-vs-recompute estimate."""

from __future__ import annotations

import math

import pytest
from kvfleet_engine import contract
from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.contract.kv_fetch_decision import estimate_fetch


def test_the_hint_round_trips_through_the_engines_reader():
    params = contract.peer_prefix_hint("http://10.0.0.7:8000/", [3, 2**63 - 1])
    assert params == {"peer_prefix": {"url": "http://10.0.0.7:8000/",
                                      "block_hashes": [3, 2**63 - 1]}}
    parsed = contract.parse_peer_prefix({**params, "do_remote_decode": False})
    assert parsed == pp.PeerPrefix("http://10.0.0.7:8000", (3, 2**63 - 1))
    assert parsed.export_url == "http://10.0.0.7:8000/v1/kv_cache/export"
    assert contract.parse_peer_prefix(None) is None
    assert contract.parse_peer_prefix({"do_remote_prefill": True}) is None
    assert contract.parse_peer_prefix({"peer_prefix": None}) is None
    assert contract.parse_peer_prefix(
        {"peer_prefix": {"url": "https://[::1]:9", "block_hashes": [0]}}) is not None
    timed = contract.parse_peer_prefix(contract.peer_prefix_hint("http://h:1", [3], 0.25))
    assert timed.timeout_s == 0.25 and parsed.timeout_s is None
    assert timed.fetch_timeout_s(5.0) == 0.25 and timed.fetch_timeout_s(0.1) == 0.1
    assert parsed.fetch_timeout_s(5.0) == 5.0


@pytest.mark.parametrize("value", [
    [], "x", {"block_hashes": [1]}, {"url": 5, "block_hashes": [1]},
    {"url": "", "block_hashes": [1]}, {"url": "x" * 3000, "block_hashes": [1]},
    {"url": "gopher://h:1", "block_hashes": [1]}, {"url": "http://:80", "block_hashes": [1]},
    {"url": "http://u:p@h:1", "block_hashes": [1]}, {"url": "http://h:1/v1", "block_hashes": [1]},
    {"url": "http://h:1?a=b", "block_hashes": [1]}, {"url": "http://h:1#f", "block_hashes": [1]},
    {"url": "http://h:99999", "block_hashes": [1]}, {"url": "http://h:0", "block_hashes": [1]},
    {"url": "http://h:1"}, {"url": "http://h:1", "block_hashes": []},
    {"url": "http://h:1", "block_hashes": [True]}, {"url": "http://h:1", "block_hashes": [1.0]},
    {"url": "http://h:1", "block_hashes": [2**63]},
    {"url": "http://h:1", "block_hashes": [1] * (pp.MAX_PEER_PREFIX_BLOCKS + 1)},
    {"url": "http://h:1", "block_hashes": [1], "timeout_s": 0},
    {"url": "http://h:1", "block_hashes": [1], "timeout_s": -1},
    {"url": "http://h:1", "block_hashes": [1], "timeout_s": True},
    {"url": "http://h:1", "block_hashes": [1], "timeout_s": "1"},
    {"url": "http://h:1", "block_hashes": [1], "timeout_s": float("nan")},
    {"url": "http://h:1", "block_hashes": [1], "timeout_s": 3601},
])
def test_a_malformed_hint_is_refused_with_a_reason(value):
    with pytest.raises(pp.PeerPrefixError, match="peer_prefix"):
        contract.parse_peer_prefix({"peer_prefix": value})


def test_the_builder_refuses_what_the_engine_would():
    with pytest.raises(pp.PeerPrefixError):
        contract.peer_prefix_hint("http://h:1/path", [1])
    with pytest.raises(pp.PeerPrefixError):
        contract.peer_prefix_hint("http://h:1", [])


def test_every_outcome_is_named_once():
    assert len(set(pp.OUTCOMES)) == len(pp.OUTCOMES) == 11


@pytest.mark.parametrize("bandwidth, latency, want", [
    (1e9, 0.001, True),  # 10 blocks x 1 MB at 1 GB/s: 11 ms < 160 ms to recompute
    (1e7, 0.001, False),  # at 10 MB/s: 1 s
    (0.0, 0.0, False), (math.nan, 0.0, False), (math.inf, 0.0, False),
])
def test_fetch_estimate(bandwidth, latency, want):
    est = estimate_fetch(num_blocks=10, block_size=16, bytes_per_block=1 << 20,
                         bandwidth_bytes_per_s=bandwidth, latency_s=latency,
                         prefill_tokens_per_s=1000.0)
    assert est.recompute_s == pytest.approx(0.16)
    assert est.is_fetch_better is want


def test_fetch_estimate_margin_and_edges():
    kw = dict(block_size=16, bytes_per_block=1 << 20, bandwidth_bytes_per_s=1e9, latency_s=0.0,
              prefill_tokens_per_s=1000.0)
    assert estimate_fetch(num_blocks=10, margin=10.0, **kw).is_fetch_better is True
    assert estimate_fetch(num_blocks=10, margin=20.0, **kw).is_fetch_better is False
    assert estimate_fetch(num_blocks=0, **kw).is_fetch_better is False
    with pytest.raises(ValueError):
        estimate_fetch(num_blocks=1, **{**kw, "prefill_tokens_per_s": 0.0})
    with pytest.raises(ValueError):
        estimate_fetch(num_blocks=-1, **kw)
