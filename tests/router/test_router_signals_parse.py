import pytest
from kvfleet_router.config import EndpointConfig
from kvfleet_router.endpoint import EndpointState, Signals
from kvfleet_router.signals import parse_metrics

CURRENT = """# HELP vllm:num_requests_running running
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
vllm:num_requests_running{model_name="b"} 1.0
vllm:num_requests_waiting{model_name="a"} 2.0
vllm:kv_cache_usage_perc{model_name="a"} 0.25
vllm:kv_cache_usage_perc{model_name="b"} 0.75
vllm:cache_config_info{block_size="16",num_gpu_blocks="512"} 1.0
vllm:prefix_cache_hits_total{model_name="a"} 12.0
"""
LEGACY = 'vllm:gpu_cache_usage_perc{model_name="a"} 0.6\nvllm:num_requests_waiting 4\n'


def test_parse_current_names():
    s = parse_metrics(CURRENT, now=7.0)
    assert (s.num_running, s.num_waiting, s.kv_usage, s.block_size, s.scraped_at) == (
        4.0, 2.0, pytest.approx(0.5), 16, 7.0)


def test_engine_draining_gauge():
    running = 'vllm:num_requests_running{model_name="a"} 1.0\n'
    assert parse_metrics(running + 'kvfleet:draining{model_name="a"} 1.0\n', now=1.0).is_draining
    assert not parse_metrics(running + 'kvfleet:draining{model_name="a"} 0.0\n',
                             now=1.0).is_draining
    assert not parse_metrics(CURRENT, now=1.0).is_draining


def test_parse_legacy_names_and_garbage():
    s = parse_metrics(LEGACY + "garbage line\nvllm:num_requests_running{bad NaNx\n", now=1.0)
    assert s.kv_usage == pytest.approx(0.6) and s.num_waiting == 4.0 and s.num_running == 0.0


def test_stale_scrape_is_unknown_not_idle():
    e = EndpointState.from_config(EndpointConfig(name="a", url="http://a:1"))
    e.num_in_flight = 2
    e.apply_scrape(Signals(num_running=9, num_waiting=1, kv_usage=0.9, scraped_at=10.0))
    e.is_signals_fresh = e.signals.is_fresh(now=12.0, stale_after_s=5.0)
    assert e.queue_depth() == 10 and e.kv_usage() == 0.9
    e.is_signals_fresh = e.signals.is_fresh(now=16.0, stale_after_s=5.0)
    assert not e.is_signals_fresh
    assert e.kv_usage() is None and e.queue_depth() == 2  # router's own count only
    assert not Signals().is_fresh(now=1.0, stale_after_s=5.0)


@pytest.mark.parametrize("body", [
    "vllm:num_requests_running 0\nvllm:num_requests_waiting -4\nvllm:kv_cache_usage_perc 0.1\n",
    "vllm:num_requests_running 0\nvllm:num_requests_waiting 1e300\nvllm:kv_cache_usage_perc 0.1\n",
    "vllm:num_requests_running 1000001\nvllm:kv_cache_usage_perc 0.1\n",
    "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 1.5\n",
    "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc NaN\n",
], ids=["negative", "huge", "past-the-limit", "kv-over-1", "kv-nan"])
def test_a_figure_no_engine_can_report_reads_as_unknown(body):
    """Garbage that parses must not pass as a reading: unknown (never fresh), not idle."""
    s = parse_metrics(body, now=5.0)
    assert s.scraped_at == 0.0


def test_the_limits_themselves_are_readings():
    s = parse_metrics("vllm:num_requests_running 1000000\nvllm:num_requests_waiting 0\n"
                      "vllm:kv_cache_usage_perc 1.0\n", now=5.0)
    assert s.scraped_at == 5.0 and s.num_running == 1e6 and s.kv_usage == 1.0
