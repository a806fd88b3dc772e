"""The router's memory stays bounded under clients that never repeat themselves (issue 31
item 4; production-stack#687, a prefix trie that grew until the router was OOM-killed).

Every table a request can grow by naming something new (a prompt, a session id, a tenant)
has a cap; bench/router_memory.py measures the RSS of a real router over 1M such requests,
and this file checks each cap by counting entries, at a smaller scale and with small caps
so they fill quickly: first each capped structure alone, then all of them through the real
router app (aiohttp, in process) in front of an in-process backend.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kvfleet_router.app import RouterApp
from kvfleet_router.config import (
    ConfigError,
    FlowControlConfig,
    QuotasConfig,
    RouterConfig,
    TenantQuota,
)
from kvfleet_router.flow.gate import FlowGate
from kvfleet_router.flow.service import AttainedService
from kvfleet_router.prefix_index import ApproxPrefixIndex
from kvfleet_router.quota import QuotaBook
from kvfleet_router.wait_queue import WaitQueue
from router_fixtures import in_process_backend

# --- each cap alone ---


def test_attained_service_keeps_at_most_its_cap_of_tenants_under_a_flood_of_new_ones():
    s = AttainedService(window_s=60.0, max_tenants=1000)
    for i in range(30_000):  # 30 s of 1,000 new tenants a second: none decays in a 60 s window
        s.charge(f"t{i}", 300, i / 1000)
        assert len(s) <= 1000
    assert len(s) >= 750  # pruned to three quarters, not emptied


def test_pruning_forgets_the_least_served_so_a_heavy_tenant_keeps_its_place():
    s = AttainedService(window_s=60.0, max_tenants=100)
    s.charge("heavy", 1_000_000, 0.0)
    for i in range(5_000):
        s.charge(f"t{i}", 10 + i % 7, 1.0)
    assert s.value("heavy", 1.0) > 900_000  # forgetting it would put it first in line
    s.charge("last", 1, 1.0)
    assert s.value("last", 1.0) == 1  # the tenant just charged is never the one dropped


def test_the_recent_meter_and_the_queue_follow_the_configured_cap():
    fc = FlowControlConfig(max_tracked_tenants=64)
    queue = WaitQueue(16, fc)
    gate = FlowGate(queue.service)
    for i in range(2_000):
        gate.charge(f"t{i}", 100, i / 1000)
    assert len(queue.service) <= 64 and len(gate.recent) <= 64
    queue.configure(FlowControlConfig(max_tracked_tenants=32))  # a config push lowers it
    for i in range(2_000, 4_000):
        gate.charge(f"t{i}", 100, i / 1000)
    assert len(queue.service) <= 32 and len(gate.recent) <= 32


def test_quota_buckets_stay_at_their_cap_even_when_none_is_full():
    # rpm 1: every new tenant's request bucket is empty for a minute after its request, so
    # dropping full buckets alone frees nothing
    book = QuotaBook(QuotasConfig(default=TenantQuota(rpm=1), max_tracked_tenants=500))
    for i in range(20_000):
        assert book.admit(f"t{i}", 1, 0.0).is_admitted
        assert len(book) <= 500
    book.configure(QuotasConfig(default=TenantQuota(rpm=1), max_tracked_tenants=100))
    book.admit("one-more", 1, 0.0)
    assert len(book) <= 100  # a config push lowers it


@pytest.mark.parametrize("section", ["flow_control", "quotas"])
def test_a_cap_below_its_floor_is_refused_with_its_path(section):
    with pytest.raises(ConfigError, match=rf"{section}\.max_tracked_tenants"):
        RouterConfig.from_dict({"endpoints": [], section: {"max_tracked_tenants": 0}})


# --- all of them, through the router app ---

NUM_REQUESTS = 6_000
CAPS = {"blocks": 800, "tenants": 300, "labels": 5, "sessions": 400}


def _backend() -> web.Application:
    """One-token answers, streamed or not; idle /metrics."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        usage = {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}
        if not body.get("stream"):
            return web.json_response({"id": "x", "object": "text_completion", "model": "m",
                                      "choices": [{"index": 0, "text": "a",
                                                   "finish_reason": "length"}],
                                      "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"id": "x", "object": "text_completion", "model": "m",
                 "choices": [{"index": 0, "text": "a", "finish_reason": "length"}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    return in_process_backend(completions)


def _tenant_series(metrics_text: str) -> set[str]:
    return {line.split('tenant="', 1)[1].split('"', 1)[0]
            for line in metrics_text.splitlines()
            if line.startswith("kvfleet_router_flow_") and 'tenant="' in line}


async def test_unique_prompts_sessions_and_tenants_fill_every_table_to_its_cap_and_no_further():
    backends = [TestClient(TestServer(_backend())) for _ in range(2)]
    for b in backends:
        await b.start_server()
    cfg = RouterConfig.from_dict({
        "endpoints": [{"name": f"b{i}", "url": str(b.make_url("")).rstrip("/"),
                       "capacity": 10_000} for i, b in enumerate(backends)],
        "prefix": {"max_blocks_per_endpoint": CAPS["blocks"]},
        "flow_control": {"max_tracked_tenants": CAPS["tenants"],
                         "max_tenant_labels": CAPS["labels"]},
        "quotas": {"default": {"rpm": 1}, "max_tracked_tenants": CAPS["tenants"]},
    })
    app = RouterApp(cfg, "admin-token")
    router = TestClient(TestServer(app.build()))
    await router.start_server()
    core, dispatcher = app.core, app._dispatcher
    for e in core.registry.endpoints:
        e.output_lengths.max_keys = CAPS["sessions"]  # 10,000 by default: fill it sooner
    try:
        async def one(i: int) -> int:
            body = {"model": "m", "prompt": f"{i:08d} " + "filler " * 40, "max_tokens": 1,
                    "stream": i % 2 == 0}  # streams teach the per-session output lengths
            headers = {"x-session-id": f"s{i}", "x-kvfleet-tenant": f"t{i}"}
            resp = await router.post("/v1/completions", json=body, headers=headers)
            await resp.read()
            return resp.status

        for start in range(0, NUM_REQUESTS, 50):
            statuses = await asyncio.gather(*(one(i) for i in range(start, start + 50)))
            assert set(statuses) == {200}, statuses
        metrics_text = await (await router.get("/metrics")).text()
    finally:
        await router.close()
        for b in backends:
            await b.close()

    # every prompt recorded 4 new blocks (256+ bytes, 64-byte blocks): 12,000 per endpoint
    for e in core.registry.endpoints:
        assert core.approx.num_blocks(e.name) == CAPS["blocks"]
        assert len(e.output_lengths.by_session) == CAPS["sessions"]
    assert len(core.approx._owners) <= 2 * CAPS["blocks"]  # the reverse map follows the LRU
    assert 0 < len(app.queue.service) <= CAPS["tenants"]
    assert 0 < len(dispatcher.gate.recent) <= CAPS["tenants"]
    assert 0 < len(app.gate.book) <= CAPS["tenants"]
    assert len(dispatcher._labels._given) == CAPS["labels"]
    # the tenant label set of every flow series: the first five seen (the default tenant,
    # labelled at start-up, is one of them), then `other`
    assert _tenant_series(metrics_text) == {"default", "t0", "t1", "t2", "t3", "other"}
    # what lives only while a request does is gone with it
    assert len(app.queue) == 0 and all(e.num_in_flight == 0 for e in core.registry.endpoints)
    assert not any(dispatcher.gate.seats.num_held(e.name) for e in core.registry.endpoints)


def test_an_endpoint_that_left_leaves_nothing_in_the_prefix_index():
    idx = ApproxPrefixIndex(block_bytes=4, max_blocks_per_endpoint=100)
    for n in range(50):  # scale-ups and -downs name new endpoints for as long as it runs
        name = f"pool-decode-{n}"
        idx.record(name, idx.hash_text(f"{n:04d}shared-prefix"))
        idx.record("stays", idx.hash_text(f"{n:04d}shared-prefix"))
        idx.forget_endpoint(name)
    assert idx.endpoints() == ["stays"] and list(idx._solo) == ["stays"]
    assert all(owners == {"stays"} for owners in idx._owners.values())
