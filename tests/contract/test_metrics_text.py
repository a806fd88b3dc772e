"""The contract's /metrics parser: label syntax, name precedence, and what counts as bad."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from kvfleet_engine import contract as c

QUOTED = (Path(__file__).parent.parent / "fixtures" / "metrics" / "quoted-labels.txt").read_text()


def test_label_values_keep_commas_braces_and_unescape_per_the_text_format():
    samples = c.parse_text(QUOTED).samples
    labels = [s.labels for s in samples]
    assert labels[0] == {"model_name": "org/model,v2", "lora": "a{b}c=d"}
    assert labels[1] == {"model_name": 'say "hi", ok', "path": "C:\\models\\x"}
    assert labels[2] == {"model_name": "two\nlines"}  # spaces around tokens, trailing comma
    assert labels[4]["block_size"] == "32" and labels[4]["note"] == 'a,block_size="99"'
    assert [s.value for s in samples] == [2, 3, 1, 0.5, 1, 1]


@pytest.mark.parametrize("line", [
    'vllm:num_requests_running{a="1",a="2"} 1',  # a label twice
    'vllm:num_requests_running{a="1"}1',  # no space before the value
    'vllm:num_requests_running{a="1" b="2"} 1',  # no comma between labels
    'vllm:num_requests_running{a="1} 1',  # unterminated value
    "vllm:num_requests_running{a=1} 1",  # unquoted value
    "vllm:num_requests_running-x 1",
    "vllm:num_requests_running 1 2 3",
    "vllm:num_requests_running 1 1.5",  # timestamps are integers (ms)
    "vllm:num_requests_running one",
])
def test_malformed_lines_are_skipped_and_counted(line):
    text = f"{line}\nvllm:num_requests_waiting 2\n"
    for read in (c.read_metrics, c.read_gauges):
        got = read(text)
        assert got.num_bad_lines == 1 and got.first_bad_line == line
        assert c.NUM_REQUESTS_RUNNING not in got.gauges and got.is_usable


def test_current_name_wins_over_legacy_in_either_order():
    old, new = "vllm:gpu_cache_usage_perc 0.9\n", "vllm:kv_cache_usage_perc 0.2\n"
    for text in (old + new, new + old):
        assert c.read_gauges(text).gauges[c.KV_CACHE_USAGE_PERC] == 0.2
    assert c.read_gauges(old).gauges[c.KV_CACHE_USAGE_PERC] == 0.9


def test_hot_path_skips_lines_it_does_not_read():
    text = "vllm:num_requests_running 1\nvllm:prompt_tokens_total garbage\n"
    assert c.read_gauges(text).num_bad_lines == 0
    assert c.read_metrics(text).num_bad_lines == 1


def test_similar_names_are_not_confused():
    """The per-request TPOT histogram is its own family, not the legacy name of the per-gap
    one (vllm:time_per_output_token_seconds) it ends with."""
    text = ('vllm:num_requests_waiting_by_reason{reason="capacity"} 9\n'
            "vllm:num_requests_waiting 1\n"
            "vllm:request_time_per_output_token_seconds_bucket{le=\"+Inf\"} 4\n")
    got = c.read_metrics(text)
    assert got.gauges == {c.NUM_REQUESTS_WAITING: 1}
    assert got.histograms == {c.REQUEST_TIME_PER_OUTPUT_TOKEN: ((math.inf, 4.0),)}
    legacy = c.read_metrics(text + "vllm:time_per_output_token_seconds_bucket{le=\"+Inf\"} 7\n")
    assert legacy.histograms[c.INTER_TOKEN_LATENCY] == ((math.inf, 7.0),)
    assert legacy.histograms[c.REQUEST_TIME_PER_OUTPUT_TOKEN] == ((math.inf, 4.0),)


def test_special_values():
    got = c.read_metrics('vllm:num_requests_running -Inf\nvllm:num_requests_waiting 1e1\n'
                         'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 3\n')
    assert got.gauges == {c.NUM_REQUESTS_WAITING: 10.0}
    assert got.histograms[c.TIME_TO_FIRST_TOKEN] == ((math.inf, 3.0),)
