"""The `pending` scorer's count: a request is pending on its endpoint from the routing
decision to the backend's first byte (or the exchange's end without one), once; the scorer
ranks by it, beside the queue scorer, at the weight where one pending request outweighs one
more in flight. Live through the real router and an in-process backend whose first byte
waits on the test; in the simulator through the fleet's own bookkeeping."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kvfleet_router.app import RouterApp
from kvfleet_router.config import ConfigError, PipelineConfig, RouterConfig
from kvfleet_router.policies.policy import Policy
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore
from policy_fixtures import cfg, ctx, ep
from router_fixtures import in_process_backend

EVENT = {"id": "c1", "object": "text_completion", "model": "m",
         "choices": [{"index": 0, "text": "a", "finish_reason": None}]}


def test_a_request_is_pending_from_its_start_to_its_first_byte_once():
    core = RouterCore(RouterConfig.from_dict(
        {"endpoints": [{"name": "a", "url": "http://a:1"}]}), rng=random.Random(0))
    routed = core.route(RequestInfo(prompt_text="hello"), "unified", 0.0)
    e = core.start(routed)
    assert e is not None and (e.num_in_flight, e.num_pending) == (1, 1)
    core.first_byte(routed)
    assert (e.num_in_flight, e.num_pending) == (1, 0)
    core.first_byte(routed)  # the end of the exchange says it again: counted once
    core.finish(e)
    assert (e.num_in_flight, e.num_pending) == (0, 0)


@pytest.mark.parametrize("pending_weight, picked", [(1.01, "a"), (0.99, "b"), (0.0, "b")])
def test_pending_weighed_beside_the_queue_decides_at_one_to_one(pending_weight, picked):
    """a: 2 in flight, both answering; b: 1 in flight, still prefilling. The queue alone
    prefers b; one pending request outweighs one more in flight once pending's weight is
    above the queue's."""
    a, b = ep("a", in_flight=2), ep("b", in_flight=1)
    b.num_pending = 1
    scorers = {"queue": 1.0, "pending": pending_weight} if pending_weight else {"queue": 1.0}
    policy = Policy("p", cfg(), PipelineConfig(scorers=scorers))
    assert policy.choose([a, b], ctx()).endpoint.name == picked  # type: ignore[union-attr]


def test_pending_is_a_load_term_in_a_pipeline_and_a_weight_of_cache_aware():
    PipelineConfig(scorers={"pending": 1.0})  # bounds load itself: no filter needed
    assert RouterConfig.from_dict(
        {"policy": {"weights": {"prefix": 1, "queue": 4, "pending": 16}}}
    ).policy.weights["pending"] == 16
    with pytest.raises(ConfigError, match="unknown scorer"):
        PipelineConfig(scorers={"pendin": 1.0})


async def router_before(completions):  # type: ignore[no-untyped-def]
    """(backend client, router app, router client): the real router in front of one
    in-process backend whose /v1/completions is `completions`."""
    upstream = TestClient(TestServer(in_process_backend(completions)))
    await upstream.start_server()
    app = RouterApp(RouterConfig.from_dict(
        {"endpoints": [{"name": "b0", "url": str(upstream.make_url("")).rstrip("/")}]}),
        "admin-token")
    router = TestClient(TestServer(app.build()))
    await router.start_server()
    return upstream, app, router


async def test_the_live_router_counts_pending_until_the_backends_first_byte():
    first, finish = asyncio.Event(), asyncio.Event()

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        await first.wait()  # the engine queues and prefills
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + json.dumps(EVENT).encode() + b"\n\n")
        await finish.wait()  # decoding
        await resp.write(b"data: [DONE]\n\n")
        return resp

    upstream, app, router = await router_before(completions)
    try:
        e = app.core.registry.endpoints[0]

        async def until(check) -> None:  # type: ignore[no-untyped-def]
            for _ in range(200):
                if check():
                    return
                await asyncio.sleep(0.01)
            raise AssertionError((e.num_in_flight, e.num_pending))

        sent = asyncio.create_task(router.post(
            "/v1/completions", json={"model": "m", "prompt": "hi", "stream": True}))
        await until(lambda: (e.num_in_flight, e.num_pending) == (1, 1))
        first.set()
        await until(lambda: (e.num_in_flight, e.num_pending) == (1, 0))
        finish.set()
        resp = await sent
        assert b"[DONE]" in await resp.read()
        await until(lambda: (e.num_in_flight, e.num_pending) == (0, 0))
    finally:
        await router.close()
        await upstream.close()


async def test_an_exchange_that_fails_before_its_first_byte_is_no_longer_pending():
    async def completions(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=503, text="overloaded")

    upstream, app, router = await router_before(completions)
    try:
        resp = await router.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        await resp.read()
        e = app.core.registry.endpoints[0]
        assert (e.num_in_flight, e.num_pending) == (0, 0)
    finally:
        await router.close()
        await upstream.close()
