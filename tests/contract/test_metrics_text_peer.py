"""Rule 8 of the /metrics reader: the peer-prefix counters and histogram sums, read in
full and, on request only, on the router's fast path."""

from __future__ import annotations

from kvfleet_engine import contract as c
from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.contract.metrics_text import PEER_FAMILIES

TEXT = "\n".join([
    'vllm:num_requests_running{model_name="a"} 1',
    'kvfleet:peer_fetch_bytes_total{model_name="a"} 1000',
    'kvfleet:peer_fetch_bytes_total{model_name="b"} 24',
    'kvfleet:peer_fetch_blocks_total{model_name="a"} 2',
    'kvfleet:peer_fetch_seconds_bucket{model_name="a",le="0.1"} 1',
    'kvfleet:peer_fetch_seconds_bucket{model_name="a",le="+Inf"} 2',
    'kvfleet:peer_fetch_seconds_count{model_name="a"} 2',
    'kvfleet:peer_fetch_seconds_sum{model_name="a"} 0.25',
    'kvfleet:peer_fetch_seconds_sum{model_name="b"} NaN',
    'kvfleet:peer_export_blocks_total{model_name="a"} 4',
    'kvfleet:peer_export_bytes_total{model_name="a"} 4096',
    'vllm:time_to_first_token_seconds_sum{model_name="a"} 3.5', ""])


def test_the_full_reader_has_the_peer_series_and_histogram_sums():
    m = c.read_metrics(TEXT)
    assert m.counters[pp.PEER_FETCH_BYTES] == 1024  # label sets summed
    assert m.counters[pp.PEER_FETCH_BLOCKS] == 2 and m.counters[pp.PEER_EXPORT_BLOCKS] == 4
    assert m.histograms[pp.PEER_FETCH_SECONDS] == ((0.1, 1.0), (float("inf"), 2.0))
    assert m.histogram_sums == {pp.PEER_FETCH_SECONDS: 0.25,  # NaN left out
                                c.TIME_TO_FIRST_TOKEN: 3.5}
    assert m.num_bad_lines == 0


def test_the_fast_path_reads_them_only_when_asked():
    plain = c.read_gauges(TEXT)
    assert plain.counters == {} and plain.histograms == {} and plain.histogram_sums == {}
    peer = c.read_gauges(TEXT, also=PEER_FAMILIES)
    assert peer.counters[pp.PEER_EXPORT_BYTES] == 4096
    assert peer.histogram_sums == {pp.PEER_FETCH_SECONDS: 0.25}  # not the TTFT sum
    assert c.TIME_TO_FIRST_TOKEN not in peer.histograms


def test_the_timed_out_fetch_counters_are_peer_families():
    text = "\n".join([
        'vllm:num_requests_running{model_name="a"} 1',
        'kvfleet:peer_fetch_timeout_bytes_asked_total{model_name="a"} 8192',
        'kvfleet:peer_fetch_timeout_bytes_asked_total{model_name="b"} 8',
        'kvfleet:peer_fetch_timeout_seconds_total{model_name="a"} 1.5',
        'kvfleet:peer_fetch_timeout_seconds_created{model_name="a"} 1.7e9', ""])
    for m in (c.read_metrics(text), c.read_gauges(text, also=PEER_FAMILIES)):
        assert m.counters == {pp.PEER_FETCH_TIMEOUT_BYTES: 8200,
                              pp.PEER_FETCH_TIMEOUT_SECONDS: 1.5}
        assert m.histogram_sums == {} and m.num_bad_lines == 0
