"""signals: parsing vLLM/kvfleet metrics (current and legacy names) and windowed aggregation."""

import math

import pytest
from kvfleet_operator.decide.role_signals import (
    MetricsParseError,
    Scrape,
    ScrapeLog,
    aggregate,
    histogram_quantile,
    parse_metrics,
)

CURRENT = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 5
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m"} 7
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="m"} 1000
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 400
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 2
vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="m"} 9
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 10
vllm:time_to_first_token_seconds_count{model_name="m"} 10
vllm:time_to_first_token_seconds_sum{model_name="m"} 3.0
# TYPE kvfleet:num_waiting_prompt_tokens gauge
kvfleet:num_waiting_prompt_tokens 640
# TYPE kvfleet:role gauge
kvfleet:role{role="decode"} 1
# TYPE kvfleet:draining gauge
kvfleet:draining 1
"""

LEGACY = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.05",model_name="m"} 4
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4
vllm:time_per_output_token_seconds_count{model_name="m"} 4
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.1
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 12
"""


def test_parse_current_names():
    s = parse_metrics(CURRENT)
    assert (s.num_running, s.num_waiting, s.kv_usage) == (3, 5, 0.25)
    assert (s.num_preemptions, s.num_prompt_tokens, s.num_prefix_hits) == (7, 1000, 400)
    assert s.ttft == ((0.1, 2), (1.0, 9), (math.inf, 10))
    assert s.num_requests == 10
    assert s.num_waiting_prompt_tokens == 640
    assert s.role == "decode" and s.is_draining


def test_parse_legacy_names():
    s = parse_metrics(LEGACY)
    assert s.kv_usage == 0.5
    assert s.itl == ((0.05, 4), (math.inf, 4))
    assert s.num_prefix_hits == 12
    assert s.role is None and not s.is_draining


def test_current_name_wins_over_legacy_whatever_the_order():
    both = LEGACY + CURRENT
    assert parse_metrics(both).kv_usage == 0.25
    assert parse_metrics(CURRENT + LEGACY).kv_usage == 0.25


def test_label_sets_are_summed_and_untyped_counters_read():
    text = (
        'vllm:num_requests_waiting{model_name="a"} 2\n'
        'vllm:num_requests_waiting{model_name="b"} 3\n'
        "vllm:num_preemptions_total 4\n"
    )
    s = parse_metrics(text)
    assert s.num_waiting == 5 and s.num_preemptions == 4


@pytest.mark.parametrize("body", ["<html>oops</html>", 'vllm:x{le="1" 2\n', "a b c d\n"])
def test_garbage_is_a_parse_error(body):
    with pytest.raises(MetricsParseError):
        parse_metrics(body)


@pytest.mark.parametrize(
    "buckets,q,expected",
    [
        ({}, 0.9, None),
        ({1.0: 0, math.inf: 0}, 0.9, None),
        ({1.0: 10, math.inf: 10}, 0.5, 0.5),  # linear inside the first bucket from 0
        ({0.1: 0, 0.2: 10, math.inf: 10}, 0.9, 0.19),
        ({0.1: 5, math.inf: 10}, 0.9, 0.1),  # in +Inf: the highest finite bound
        ({0.1: 2, 1.0: 9, math.inf: 10}, 0.5, 0.1 + 0.9 * 3 / 7),
    ],
)
def test_histogram_quantile(buckets, q, expected):
    got = histogram_quantile(q, buckets)
    assert got == pytest.approx(expected) if expected is not None else got is None


def metrics(waiting=0, running=0, kv=0.0, preempt=0, prompt=0, hits=0, ttft=(0, 0, 0), itl=(0, 0),
            queue=(0, 0)):
    """A minimal exposition with cumulative TTFT buckets (0.1, 1, +Inf), ITL (0.05, +Inf)
    and queue time (0.25, +Inf)."""
    return parse_metrics(
        f"vllm:num_requests_waiting {waiting}\nvllm:num_requests_running {running}\n"
        f"vllm:kv_cache_usage_perc {kv}\nvllm:num_preemptions_total {preempt}\n"
        f"vllm:prompt_tokens_total {prompt}\nvllm:prefix_cache_hits_total {hits}\n"
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        f'vllm:time_to_first_token_seconds_bucket{{le="0.1"}} {ttft[0]}\n'
        f'vllm:time_to_first_token_seconds_bucket{{le="1.0"}} {ttft[1]}\n'
        f'vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {ttft[2]}\n'
        f"vllm:time_to_first_token_seconds_count {ttft[2]}\n"
        "# TYPE vllm:inter_token_latency_seconds histogram\n"
        f'vllm:inter_token_latency_seconds_bucket{{le="0.05"}} {itl[0]}\n'
        f'vllm:inter_token_latency_seconds_bucket{{le="+Inf"}} {itl[1]}\n'
        f"vllm:inter_token_latency_seconds_count {itl[1]}\n"
        "# TYPE vllm:request_queue_time_seconds histogram\n"
        f'vllm:request_queue_time_seconds_bucket{{le="0.25"}} {queue[0]}\n'
        f'vllm:request_queue_time_seconds_bucket{{le="+Inf"}} {queue[1]}\n'
        f"vllm:request_queue_time_seconds_count {queue[1]}\n"
    )


def test_aggregate_window_rates_and_histogram_deltas():
    log = ScrapeLog()
    # Replica a: a baseline before the window, then two scrapes inside it.
    log.add("a", Scrape(0.0, metrics(ttft=(100, 100, 100), prompt=10_000, hits=0,
                                     queue=(50, 100))))
    log.add("a", Scrape(10.0, metrics(waiting=2, running=4, kv=0.2, prompt=10_000)))
    log.add(
        "a",
        Scrape(
            20.0,
            metrics(
                waiting=4,
                running=4,
                kv=0.4,
                preempt=5,
                prompt=12_000,
                hits=500,
                ttft=(100, 109, 110),
                itl=(0, 10),
                queue=(60, 110),
            ),
        ),
    )
    log.add("b", Scrape(20.0, metrics(waiting=1, running=2, kv=0.9)))
    sig = aggregate(
        log,
        {"a": "decode", "b": "decode"},
        now=20.0,
        window_s=15.0,
        stale_after_s=5.0,
        num_held_requests=3,
    )
    d = sig.roles["decode"]
    assert (d.num_replicas, d.num_known, d.num_unknown) == (2, 2, 0)
    assert d.num_waiting == pytest.approx(3 + 1)  # a's window mean + b
    assert d.num_running == pytest.approx(4 + 2)
    assert d.kv_usage_mean == pytest.approx((0.3 + 0.9) / 2)
    assert d.kv_usage_max == pytest.approx(0.9)
    # Rates from the baseline at t=0 to t=20 (b has a single sample: no rate yet).
    assert d.preemptions_per_s == pytest.approx(5 / 20)
    assert d.request_rate == pytest.approx(10 / 20)
    assert d.prompt_tokens_per_s == pytest.approx(2000 / 20)
    assert d.uncached_prompt_tokens_per_s == pytest.approx(1500 / 20)
    # Delta TTFT buckets: 0 below 0.1, 9 below 1.0, 10 total -> p90 at 1.0.
    assert d.ttft_p90_s == pytest.approx(1.0)
    assert d.itl_p90_s == pytest.approx(0.05)  # all 10 delta samples in the +Inf bucket
    # Queue time (vllm:request_queue_time_seconds): 10 finished in the window, all 10
    # under 0.25 s, where since start half queued longer.
    assert d.queue_time_p90_s == pytest.approx(0.9 * 0.25)
    assert d.num_held_requests == 3
    assert not d.is_idle


def test_stale_and_failed_replicas_are_unknown_never_idle():
    log = ScrapeLog()
    log.add("fresh", Scrape(100.0, metrics()))
    log.add("stale", Scrape(50.0, metrics()))
    log.add("failed", Scrape(90.0, metrics()))
    log.add("failed", Scrape(100.0, None, error="connection refused"))
    roles = {"fresh": "unified", "stale": "unified", "failed": "unified", "never": "unified"}
    u = aggregate(log, roles, now=100.0, window_s=30.0, stale_after_s=5.0).roles["unified"]
    assert (u.num_replicas, u.num_known, u.num_unknown) == (4, 1, 3)
    assert u.num_waiting == 0 and u.num_running == 0
    assert not u.is_idle
    only_fresh = aggregate(log, {"fresh": "unified"}, 100.0, 30.0, 5.0).roles["unified"]
    assert only_fresh.is_idle


def test_counter_reset_counts_from_zero():
    log = ScrapeLog()
    log.add("a", Scrape(0.0, metrics(preempt=100, ttft=(50, 50, 50))))
    log.add("a", Scrape(10.0, metrics(preempt=4, ttft=(2, 2, 2))))  # the process restarted
    a = aggregate(log, {"a": "unified"}, 10.0, 20.0, 5.0).roles["unified"]
    assert a.preemptions_per_s == pytest.approx(0.4)
    assert a.request_rate == pytest.approx(0.2)
    assert a.ttft_p90_s == pytest.approx(0.1 * 0.9 * 2 / 2)


def test_prune_keeps_one_baseline():
    log = ScrapeLog()
    for t in range(10):
        log.add("a", Scrape(float(t), metrics()))
    log.prune(now=9.0, keep_s=3.0)
    assert [s.t for s in log.scrapes["a"]] == [6.0, 7.0, 8.0, 9.0]
    log.forget("a")
    assert "a" not in log.scrapes


async def test_scrape_real_http_server():
    from aiohttp import ClientSession, web
    from kvfleet_operator.runtimes.metrics_sources import scrape

    async def ok(_):
        return web.Response(text=CURRENT, content_type="text/plain")

    async def broken(_):
        return web.Response(status=500, text="boom")

    async def junk(_):
        return web.Response(text="<html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/metrics", ok)
    app.router.add_get("/broken", broken)
    app.router.add_get("/junk", junk)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with ClientSession() as session:
            base = f"http://127.0.0.1:{port}"
            good = await scrape(session, "r0", f"{base}/metrics", now=1.0)
            assert good.sample is not None and good.sample.num_waiting == 5 and good.t == 1.0
            for path in ("/broken", "/junk"):
                bad = await scrape(session, "r0", base + path, now=2.0)
                assert bad.sample is None and bad.error.startswith("r0:")
            runner_port_closed = await scrape(session, "r1", "http://127.0.0.1:1/metrics", 3.0)
            assert runner_port_closed.sample is None
    finally:
        await runner.cleanup()


def test_a_role_at_zero_still_sees_held_requests():
    sig = aggregate(
        ScrapeLog(),
        {},
        now=1.0,
        window_s=10.0,
        stale_after_s=5.0,
        num_held_requests=4,
        expected_roles=["prefill", "decode"],
    )
    assert set(sig.roles) == {"prefill", "decode"}
    assert sig.roles["decode"].num_held_requests == 4 and sig.roles["decode"].num_replicas == 0
    assert not sig.roles["decode"].is_idle


def prom_series(name, value, pod="pool-a", **labels):
    return {
        "metric": {"__name__": name, "pod": pod, "namespace": "llm", **labels},
        "value": [1700000000.0, str(value)],
    }


PROM_RESULT = [
    prom_series("vllm:num_requests_waiting", 3, model_name="m"),
    prom_series("vllm:gpu_cache_usage_perc", 0.5),  # legacy name
    prom_series("vllm:num_preemptions_total", 9),
    prom_series("vllm:time_to_first_token_seconds_bucket", 4, le="0.1"),
    prom_series("vllm:time_to_first_token_seconds_bucket", 10, le="+Inf"),
    prom_series("vllm:time_to_first_token_seconds_count", 10),
    prom_series("kvfleet:role", 1, role="prefill"),
    prom_series("vllm:num_requests_waiting", 7, pod="pool-b"),
    {"metric": {"__name__": "vllm:num_requests_waiting"}, "value": [0, "1"]},  # no pod: skipped
]


def test_samples_from_prometheus_vector():
    from kvfleet_operator.runtimes.metrics_sources import samples_from_prometheus

    got = samples_from_prometheus(PROM_RESULT)
    assert set(got) == {"pool-a", "pool-b"}
    a = got["pool-a"]
    assert (a.num_waiting, a.kv_usage, a.num_preemptions) == (3, 0.5, 9)
    assert a.ttft == ((0.1, 4), (math.inf, 10)) and a.role == "prefill"
    assert got["pool-b"].num_waiting == 7


@pytest.mark.parametrize(
    "junk",
    [
        {"not": "a list"},
        [{"metric": {}}],
        [{"value": [0, "1"]}],
        [{"metric": {"__name__": "x", "pod": "p"}, "value": [0, "z"]}],
    ],
)
def test_samples_from_prometheus_rejects_junk(junk):
    from kvfleet_operator.runtimes.metrics_sources import samples_from_prometheus

    with pytest.raises(MetricsParseError):
        samples_from_prometheus(junk)


async def test_query_prometheus_against_a_real_http_server():
    from aiohttp import ClientSession, web
    from kvfleet_operator.runtimes.metrics_sources import query_prometheus

    seen = []

    async def query(request):
        seen.append(request.query["query"])
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": PROM_RESULT}}
        )

    async def error(_):
        return web.json_response({"status": "error", "error": "bad query"}, status=400)

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    app.router.add_get("/broken/api/v1/query", error)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        async with ClientSession() as session:
            got = await query_prometheus(session, base, 'namespace="llm"', now=5.0)
            assert seen == ['{__name__=~"vllm:.+|kvfleet:.+",namespace="llm"}']
            assert got["pool-a"].t == 5.0 and got["pool-b"].sample.num_waiting == 7
            assert await query_prometheus(session, base + "/broken", "", now=6.0) == {}
            assert await query_prometheus(session, "http://127.0.0.1:1", "", now=7.0) == {}
    finally:
        await runner.cleanup()


def test_samples_from_prometheus_leaves_out_replicas_without_a_core_gauge():
    from kvfleet_operator.runtimes.metrics_sources import samples_from_prometheus

    result = [prom_series("kvfleet:role", 1, pod="pool-c", role="decode"), *PROM_RESULT]
    got = samples_from_prometheus(result)
    assert set(got) == {"pool-a", "pool-b"}  # pool-c ages into unknown, never idle


def with_tpot(sample, under_50ms: int, total: int):
    """`sample` with vllm:request_time_per_output_token_seconds: `total` finished requests,
    `under_50ms` of them at a mean of 50 ms per output token or less, the rest under 0.1 s."""
    sample.tpot = ((0.05, float(under_50ms)), (0.1, float(total)), (math.inf, float(total)))
    return sample


def test_itl_p90_is_per_request_where_the_engines_export_it():
    """Ten requests each with 20 short gaps and two stalled (means over 50 ms): the per-gap
    p90 is under 50 ms, the per-request p90 is not. Without the per-request histogram
    (an older vLLM, or no request finished in the window) the per-gap p90 stands in."""
    log = ScrapeLog()
    log.add("a", Scrape(0.0, metrics()))
    log.add("a", Scrape(10.0, with_tpot(metrics(ttft=(10, 10, 10), itl=(190, 200)), 8, 10)))
    d = aggregate(log, {"a": "unified"}, now=10.0, window_s=15.0, stale_after_s=5.0).roles[
        "unified"]
    assert d.is_itl_per_request and d.itl_p90_s == pytest.approx(0.05 + 0.05 * (9 - 8) / 2)
    plain = ScrapeLog()
    plain.add("a", Scrape(0.0, metrics()))
    plain.add("a", Scrape(10.0, metrics(ttft=(10, 10, 10), itl=(190, 200))))
    p = aggregate(plain, {"a": "unified"}, now=10.0, window_s=15.0, stale_after_s=5.0).roles[
        "unified"]
    assert not p.is_itl_per_request and p.itl_p90_s == pytest.approx(0.05 * 180 / 190)
    text = ('vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n'
            'vllm:kv_cache_usage_perc 0\n'
            'vllm:request_time_per_output_token_seconds_bucket{le="0.05"} 3\n'
            'vllm:request_time_per_output_token_seconds_bucket{le="+Inf"} 4\n')
    assert parse_metrics(text).tpot == ((0.05, 3.0), (math.inf, 4.0))


def test_rates_do_not_depend_on_when_the_clock_started():
    # The same two scrapes, 20 s apart, at t = 1000 and 1020: rates over their 20 s.
    log = ScrapeLog()
    log.add("a", Scrape(1000.0, metrics(preempt=1, prompt=1000, hits=100, ttft=(1, 1, 1))))
    log.add("a", Scrape(1020.0, metrics(preempt=5, prompt=3000, hits=600, ttft=(5, 10, 11))))
    a = aggregate(log, {"a": "unified"}, now=1020.0, window_s=30.0,
                  stale_after_s=5.0).roles["unified"]
    assert a.request_rate == pytest.approx(10 / 20)
    assert a.preemptions_per_s == pytest.approx(4 / 20)
    assert a.prompt_tokens_per_s == pytest.approx(2000 / 20)
    assert a.uncached_prompt_tokens_per_s == pytest.approx(1500 / 20)


def test_a_scrape_exactly_stale_after_old_is_still_known():
    log = ScrapeLog()
    log.add("a", Scrape(95.0, metrics(waiting=3)))
    at = aggregate(log, {"a": "unified"}, 100.0, 30.0, stale_after_s=5.0).roles["unified"]
    assert (at.num_known, at.num_waiting) == (1, 3)
    past = aggregate(log, {"a": "unified"}, 100.01, 30.0, stale_after_s=5.0).roles["unified"]
    assert past.num_known == 0


def test_a_histogram_of_one_sample_has_quantiles():
    assert histogram_quantile(0.9, {0.1: 1, math.inf: 1}) == pytest.approx(0.09)


def test_window_edges_gauges_and_counters():
    log = ScrapeLog()
    # At the window's start exactly: the baseline, not a gauge inside the window.
    log.add("a", Scrape(0.0, metrics(waiting=10, kv=0.9, prompt=0, hits=0, ttft=(0, 0, 0))))
    log.add("a", Scrape(10.0, metrics(waiting=2, kv=0.2, prompt=100, hits=150,
                                      ttft=(0, 10, 10))))
    log.add("a", Scrape(20.0, metrics(waiting=2, kv=0.4, prompt=100, hits=150,
                                      ttft=(0, 10, 10))))
    a = aggregate(log, {"a": "unified"}, 20.0, 20.0, 5.0).roles["unified"]
    assert a.num_waiting == pytest.approx(2.0)
    assert a.kv_usage_max == pytest.approx(0.4) and a.kv_usage_mean == pytest.approx(0.3)
    # more hits than prompt tokens (counters scraped a moment apart): no uncached work,
    # never negative
    assert a.prompt_tokens_per_s == pytest.approx(100 / 20)
    assert a.uncached_prompt_tokens_per_s == 0.0
    # 10 requests in (0.1, 1]: the p90 is linear inside that bucket, 0.1 + 0.9 x 9/10
    assert a.ttft_p90_s == pytest.approx(0.91)
    # Unchanged buckets since the window's baseline are no samples, not a restart.
    quiet = aggregate(log, {"a": "unified"}, 25.0, 10.0, 10.0).roles["unified"]
    assert quiet.ttft_p90_s is None


def test_a_role_with_no_known_replica_has_no_kv_usage():
    u = aggregate(ScrapeLog(), {"a": "unified"}, 10.0, 20.0, 5.0).roles["unified"]
    assert (u.num_known, u.kv_usage_mean, u.kv_usage_max) == (0, 0.0, 0.0)
