"""kv_sharing end to end: two real `kvfleet engine` processes (tiny random model) behind a
real `kvfleet router` in precise mode.

A prompt is warmed on engine A (B drains). Then a config push drains A and activates B:
the next request sharing the prefix goes to B with a peer hint naming A, B fetches the
blocks from A (`kvfleet:peer_fetch_total{outcome="hit"}` rises, A exports them) and the
greedy output equals A's, which computed the whole prompt.
"""

from __future__ import annotations

import time

import pytest
from engine_fleet import TINY, metric_sum, start_engines
from kvfleet_engine.contract import ENGINE_TOKEN_ENV
from router_fixtures import admin_headers, http_json, start_router

pytest.importorskip("kvfleet_engine.server", reason="the engine server is not in this build")

TOKEN = {ENGINE_TOKEN_ENV: "fleet-secret-for-peer-tests"}
TOKENS = [(11 * i + 5) % 250 for i in range(16 * 6 + 3)]  # 6 full blocks of 16 + 3
BODY = {"model": "tiny-random", "prompt": TOKENS, "max_tokens": 8, "temperature": 0,
        "ignore_eos": True}


def config(version, a_state, b_state, a, b):
    ep = {"prefix_mode": "precise", "engine": "builtin"}
    return {"version": version,
            "endpoints": [{"name": "a", "url": a.url, "state": a_state, **ep},
                          {"name": "b", "url": b.url, "state": b_state, **ep}],
            "policy": {"name": "cache-aware"},
            "signals": {"poll_interval_s": 0.2, "stale_after_s": 2.0},
            "kv_sharing": {"enabled": True}}


def wait_for(check, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_a_drained_engines_prefix_is_fetched_by_its_peer(procs, tmp_path):
    a, b = start_engines(procs, [TINY, TINY], env=TOKEN)
    router = start_router(procs, tmp_path, config(1, "active", "draining", a, b), env=TOKEN)
    time.sleep(1.0)  # the router's /v1/kv_events subscriptions connect
    status, warm = http_json(router.url + "/v1/completions", BODY, timeout_s=60)
    assert status == 200
    assert metric_sum(router.url, "kvfleet_router_requests_total", endpoint="a") == 1
    time.sleep(1.0)  # A's BlockStored events reach the router

    status, _ = http_json(router.url + "/admin/config", config(2, "draining", "active", a, b),
                          method="PUT", headers=admin_headers())
    assert status == 200
    # B's block size is known once the router has scraped it (it has stored nothing yet)
    assert wait_for(lambda: metric_sum(router.url, "kvfleet_router_config_version") == 2)
    time.sleep(0.5)

    status, got = http_json(router.url + "/v1/completions", BODY, timeout_s=60)
    assert status == 200
    assert metric_sum(router.url, "kvfleet_router_requests_total", endpoint="b") == 1
    assert metric_sum(router.url, "kvfleet_router_peer_hints_total", reason="attached") == 1
    assert metric_sum(b.url, "kvfleet:peer_fetch_total", outcome="hit") == 1
    assert metric_sum(b.url, "kvfleet:peer_fetch_blocks_total") == 6
    assert metric_sum(a.url, "kvfleet:peer_export_blocks_total") == 6
    assert got["choices"][0]["text"] == warm["choices"][0]["text"]
    assert got["usage"]["completion_tokens"] == warm["usage"]["completion_tokens"] == 8
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 6 * 16
