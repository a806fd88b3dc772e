"""Garbage metrics (issue 31, item 3): an engine whose `/metrics` answers garbage is unknown,
never idle, and never causes a scale-down. Pure: parse -> scrape log -> aggregate -> decide,
time injected."""

import pytest
from kvfleet_operator.decide.autoscaler import (
    AutoscalerConfig,
    History,
    RoleLimits,
    RoleTargets,
    decide,
)
from kvfleet_operator.decide.role_signals import (
    MetricsParseError,
    Scrape,
    ScrapeLog,
    aggregate,
    parse_metrics,
)

ROLE = "unified"


def page(running: str = "0", waiting: str = "0", kv: str = "0", extra: str = "") -> str:
    return (f"vllm:num_requests_running{{model_name=\"m\"}} {running}\n"
            f"vllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\n"
            f"vllm:kv_cache_usage_perc{{model_name=\"m\"}} {kv}\n"
            "vllm:prompt_tokens_total{model_name=\"m\"} 100\n"
            "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 4\n"
            f"{extra}")  # fmt: skip


IDLE = page()

# Each shape an engine (or whatever answers on its port) can send instead of its metrics.
GARBAGE = {
    "unparseable": "\x00\x01 running=zero;; {{{\nnot prometheus at all\n",
    "html": "<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>\n",
    "empty": "",
    "all-nan": page("NaN", "NaN", "NaN"),
    "waiting-nan-beside-idle": page(waiting="NaN"),  # would read as running 0, waiting 0
    "running-inf": page(running="+Inf"),
    "negative-running": page(running="-3"),
    "negative-waiting": page(waiting="-1e3"),
    "kv-above-one": page(kv="85"),  # a percentage where a fraction belongs
    "kv-negative": page(kv="-0.5"),
    "huge-waiting": page(waiting="1e300"),
    "huge-waiting-tokens": page(extra="kvfleet:num_waiting_prompt_tokens 1e30\n"),
    "negative-counter": page(extra="vllm:generation_tokens_total{model_name=\"m\"} -50\n"),
    "huge-counter": page(extra="vllm:num_preemptions_total{model_name=\"m\"} 1e300\n"),
    "negative-bucket": page(
        extra="vllm:inter_token_latency_seconds_bucket{le=\"+Inf\",model_name=\"m\"} -7\n"),
}


def test_an_idle_page_parses_as_idle():
    s = parse_metrics(IDLE)
    assert (s.num_running, s.num_waiting, s.kv_usage) == (0, 0, 0)


@pytest.mark.parametrize("shape", sorted(GARBAGE))
def test_each_garbage_shape_is_refused_with_one_line(shape):
    with pytest.raises(MetricsParseError) as info:
        parse_metrics(GARBAGE[shape])
    assert "\n" not in str(info.value) and str(info.value)


def test_the_plausibility_limits_sit_at_their_thresholds():
    assert parse_metrics(page(kv="1")).kv_usage == 1.0  # full is real
    assert parse_metrics(page(waiting="1e6")).num_waiting == 1e6
    for bad in (page(kv="1.0001"), page(waiting="1000001")):
        with pytest.raises(MetricsParseError):
            parse_metrics(bad)


def test_one_finite_label_set_is_still_a_figure():
    # Two engine cores, one reporting NaN: the other's figure stands (contract rule 5).
    text = page() + "vllm:num_requests_waiting{model_name=\"b\"} NaN\n"
    assert parse_metrics(text).num_waiting == 0


def scrape(text: str, t: float) -> Scrape:
    """What `metrics_sources.scrape` makes of a body: a sample, or a failed scrape."""
    try:
        return Scrape(t, parse_metrics(text))
    except MetricsParseError as exc:
        return Scrape(t, None, error=str(exc))


def signals_after(bodies: dict[str, str], now: float = 100.0):
    """Two replicas scraped every second for 10 s with these bodies."""
    log = ScrapeLog()
    for t in range(int(now) - 10, int(now) + 1):
        for name, body in bodies.items():
            log.add(name, scrape(body, float(t)))
    roles = dict.fromkeys(bodies, ROLE)
    return aggregate(log, roles, now, window_s=5.0, stale_after_s=3.0)


CONFIG = AutoscalerConfig(roles={ROLE: RoleLimits(1, 4)},
                          targets={ROLE: RoleTargets(num_waiting=2, num_running=4)},
                          scale_down_window_s=0.0, max_step_down=2)  # fmt: skip


def test_idle_known_replicas_scale_down():
    signals = signals_after({"a": IDLE, "b": IDLE})
    assert signals.roles[ROLE].is_idle
    d = decide(signals, signals, {ROLE: 2}, CONFIG, History(), 100.0)
    assert d.desired[ROLE] == 1, d.reasons[ROLE]  # the control: without garbage, it scales


@pytest.mark.parametrize("shape", sorted(GARBAGE))
def test_garbage_is_unknown_never_idle_and_never_scales_down(shape):
    signals = signals_after({"a": IDLE, "b": GARBAGE[shape]})
    rs = signals.roles[ROLE]
    assert (rs.num_known, rs.num_unknown) == (1, 1)
    assert not rs.is_idle
    d = decide(signals, signals, {ROLE: 2}, CONFIG, History(), 100.0)
    assert d.desired[ROLE] == 2, d.reasons[ROLE]
    assert "unknown" in d.reasons[ROLE]
    everything = signals_after({"a": GARBAGE[shape], "b": GARBAGE[shape]})
    d = decide(everything, everything, {ROLE: 2}, CONFIG, History(), 100.0)
    assert d.desired[ROLE] == 2, d.reasons[ROLE]
