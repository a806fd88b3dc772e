"""The chaos soak's parts on their own: the seeded schedule, failure attribution, the
fault proxy's modes against a real loopback server, and the migration counter parser."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web
from kvfleet_bench.chaos import netproxy
from kvfleet_bench.chaos import schedule as sch
from kvfleet_bench.chaos.fleet import migrations_from_metrics
from kvfleet_bench.chaos.load import Outcome
from kvfleet_bench.chaos.report import FaultRecord, attribute, summarize


def test_a_seed_gives_the_same_schedule_and_another_seed_another():
    def draw(seed):
        return sch.make_schedule(seed, 600, 50, num_engines=3, hang_s=65)
    assert draw(1) == draw(1)
    assert draw(1) != draw(2)
    faults = draw(1)
    assert len(faults) == 50 and set(f.kind for f in faults) == set(sch.KINDS)
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    assert all(5 <= f.at_s <= 590 for f in faults)
    assert all(0 <= f.target < 3 for f in faults)
    assert all(f.duration_s == 65 for f in faults if f.kind == sch.ENGINE_HANG)


@pytest.mark.parametrize("args, match", [
    ((1, 600, 0), "--faults must be at least 1"),
    ((1, 10, 5), "--duration must exceed"),
])
def test_bad_schedule_arguments_are_one_line_errors(args, match):
    with pytest.raises(sch.ScheduleError, match=match):
        sch.make_schedule(*args, num_engines=3, hang_s=65)


def test_unknown_kind_is_refused():
    with pytest.raises(sch.ScheduleError, match="unknown fault kind"):
        sch.make_schedule(1, 600, 5, num_engines=3, hang_s=65, kinds=("meteor",))


def _out(i, start, end, outcome="connection"):
    return Outcome(index=i, shape="chat_stream", router=0, start_s=start, end_s=end,
                   outcome=outcome)


def _fault(kind, injected, recovered):
    return FaultRecord(index=0, kind=kind, target="x", scheduled_s=injected,
                       injected_s=injected, cleared_s=injected, recovered_s=recovered)


def test_a_failure_is_charged_to_the_fault_active_when_it_failed():
    faults = [_fault("engine_kill", 10, 12), _fault("router_kill", 30, 33)]
    outcomes = [_out(0, 9, 11), _out(1, 29, 34), _out(2, 50, 51), _out(3, 5, 6, "ok"),
                _out(4, 8, 40)]  # 4 ended after both windows but lived through router_kill
    charged = attribute(outcomes, faults, grace_s=2.0)
    assert charged == {0: "engine_kill", 1: "router_kill", 2: "none", 4: "router_kill"}
    s = summarize(outcomes, faults, {"continued": 3.0})
    assert s["num_sent"] == 5 and s["num_failed"] == 4
    assert s["failed_by_fault"] == {"engine_kill": {"connection": 1}, "none": {"connection": 1},
                                    "router_kill": {"connection": 2}}
    assert s["recovery_s"] == {"n": 2, "p50": 2.5, "max": 3.0}
    assert s["migrations"] == {"continued": 3}


def test_migration_counters_are_read_by_outcome():
    text = ('# TYPE kvfleet_router_migrations_total counter\n'
            'kvfleet_router_migrations_total{outcome="continued"} 4.0\n'
            'kvfleet_router_migrations_total{outcome="exhausted"} 1.0\n'
            'kvfleet_router_requests_total{endpoint="a"} 9.0\n')
    assert migrations_from_metrics(text) == {"continued": 4.0, "exhausted": 1.0}


@pytest.fixture
async def upstream():
    async def big(request):
        return web.Response(body=b"x" * 5000)

    async def metrics(request):
        return web.Response(text="vllm:num_requests_running 2\n")

    app = web.Application()
    app.router.add_get("/big", big)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    proxy = netproxy.FaultProxy(("127.0.0.1", port))
    await proxy.start()
    yield proxy
    await proxy.close()
    await runner.cleanup()


async def _get(proxy, path):
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.url + path) as resp:
            return await resp.read()


async def test_the_proxy_passes_slows_cuts_drops_and_serves_garbage(upstream):
    proxy = upstream
    assert await _get(proxy, "/big") == b"x" * 5000
    assert await _get(proxy, "/metrics") == b"vllm:num_requests_running 2\n"

    proxy.set_mode(netproxy.GARBAGE_METRICS)
    assert await _get(proxy, "/metrics") == netproxy.GARBAGE_BODY
    assert await _get(proxy, "/big") == b"x" * 5000

    proxy.set_mode(netproxy.LATENCY)
    proxy.latency_s = 0.3
    start = time.monotonic()
    assert await _get(proxy, "/big") == b"x" * 5000
    assert time.monotonic() - start >= 0.3

    proxy.set_mode(netproxy.TRUNCATE)
    with pytest.raises(aiohttp.ClientPayloadError):
        await _get(proxy, "/big")

    proxy.set_mode(netproxy.DROP)
    with pytest.raises((aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)):
        await _get(proxy, "/big")

    proxy.set_mode(netproxy.PASS)
    assert await _get(proxy, "/big") == b"x" * 5000
    assert proxy.num_faulted >= 3
    with pytest.raises(ValueError, match="unknown proxy mode"):
        proxy.set_mode("meteor")
    await asyncio.sleep(0)


@pytest.fixture
async def sse_server():
    events = {
        "whole": [b'data: {"choices":[{"text":"a","finish_reason":null}]}',
                  b'data: {"choices":[{"text":"b","finish_reason":"length"}]}', b"data: [DONE]"],
        "error": [b'data: {"choices":[{"text":"a","finish_reason":null}]}',
                  b'data: {"error":{"message":"backend went away","type":"server_error"}}',
                  b"data: [DONE]"],
        "cut": [b'data: {"choices":[{"text":"a","finish_reason":null}]}'],
        "no_done": [b'data: {"choices":[{"text":"b","finish_reason":"stop"}]}'],
    }

    async def handler(request):
        kind = (await request.json())["prompt"].split(":")[0].split()[-1]
        if kind == "refused":
            return web.json_response({"error": {"message": "no"}}, status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in events[kind]:
            await resp.write(event + b"\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    await runner.cleanup()


@pytest.mark.parametrize("kind, outcome", [
    ("whole", "ok"), ("error", "error_event"), ("cut", "incomplete"), ("no_done", "incomplete"),
    ("refused", "http_503"),
])
async def test_a_stream_counts_only_when_it_finished_whole(sse_server, monkeypatch, kind,
                                                           outcome):
    from kvfleet_bench.chaos import load

    monkeypatch.setattr(load, "_body", lambda shape, i, model, n: {
        "prompt": f"x {kind}: go", "stream": True})
    async with aiohttp.ClientSession() as http:
        out = await load.one_request(http, sse_server, "completion_stream", 0, 0,
                                     time.monotonic(), "m", 8, 10.0)
    assert out.outcome == outcome, out.detail
