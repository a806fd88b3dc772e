"""Acceptance: the router in front of real `kvfleet engine` processes, driven by `openai`.

* passthrough: 3 torch engines (tiny model); through the router, streaming and whole
  answers are the engine's bytes, except the per-call `id` and `created` fields;
* P/D: a prefill and a decode engine behind the router give the unified engine's tokens;
* failure: 3 simulated engines under load, one SIGKILLed: requests that had not started
  streaming all succeed, started ones end with an SSE error event;
* drain: a config push that drains one engine under load finishes its streams and sends
  it nothing new; so does an engine's own SIGTERM drain (a Kubernetes pod shutdown).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request

import openai
import pytest
from engine_fleet import SIMULATED, TINY, metric_sum, start_engines
from kvfleet_engine.contract import ENGINE_TOKEN_ENV
from router_fixtures import admin_headers, endpoints_cfg, http_json, start_router

pytest.importorskip("kvfleet_engine.server", reason="the engine server is not in this build")

GREEDY = {"temperature": 0, "ignore_eos": True}
ENGINE_TOKEN = {ENGINE_TOKEN_ENV: "fleet-secret-for-tests"}
_VOLATILE = re.compile(rb'"(id|created)":\s*("[^"]*"|\d+)')


def normalise(raw: bytes) -> bytes:
    """The bytes an engine sends, minus the two fields that differ on every call."""
    return _VOLATILE.sub(rb'"\1":"-"', raw)


def post_raw(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status, resp.read()


@pytest.fixture(scope="module")
def module_procs(tmp_path_factory):
    from helpers.procs import ProcessGroup

    with ProcessGroup(tmp_path_factory.mktemp("fleet")) as group:
        yield group


@pytest.fixture(scope="module")
def torch_fleet(module_procs, tmp_path_factory):
    """3 unified + 1 prefill + 1 decode torch engines, a unified router and a P/D router.

    The engines guard their KV events and KV transfers with a shared token (as `kvfleet up`
    sets), so the precise router below only sees events if it sends that token too."""
    engines = start_engines(module_procs, [TINY, TINY, TINY, (*TINY, "--role", "prefill"),
                                           (*TINY, "--role", "decode")], env=ENGINE_TOKEN)
    unified, (prefill, decode) = engines[:3], engines[3:]
    tmp = tmp_path_factory.mktemp("routers")
    router = start_router(module_procs, tmp, {"endpoints": endpoints_cfg(unified)})
    pd_router = start_router(module_procs, tmp, {
        "endpoints": [{"name": "pre", "url": prefill.url, "role": "prefill"},
                      {"name": "dec", "url": decode.url, "role": "decode"}],
        "pd": {"prefill_threshold_tokens": 2}})
    precise_router = start_router(module_procs, tmp, {
        "endpoints": endpoints_cfg(unified, prefix_mode="precise"),
        "policy": {"name": "prefix-cache"}}, env=ENGINE_TOKEN)
    return unified, router, pd_router, precise_router


def test_non_streaming_and_streaming_pass_through_byte_identical(torch_fleet):
    engines, router, *_ = torch_fleet
    for i, stream in enumerate([False, True, False, True]):
        body = {"model": "tiny-random", "prompt": f"passthrough {i}", "max_tokens": 8,
                "stream": stream, **GREEDY}
        if stream:
            body["stream_options"] = {"include_usage": True}
        direct = post_raw(engines[i % 3].url, body)
        routed = post_raw(router.url, body)
        assert routed[0] == direct[0] == 200
        assert normalise(routed[1]) == normalise(direct[1])
        assert routed[1].endswith(b"data: [DONE]\n\n") == stream


def test_openai_client_through_router_matches_direct(torch_fleet):
    engines, router, *_ = torch_fleet
    via = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    direct = openai.OpenAI(base_url=engines[0].url + "/v1", api_key="x", max_retries=0)
    kwargs = {"model": "tiny-random", "max_tokens": 6, "temperature": 0}
    msgs = [{"role": "user", "content": "hello router"}]
    a = via.chat.completions.create(messages=msgs, **kwargs)
    b = direct.chat.completions.create(messages=msgs, **kwargs)
    assert a.choices[0].message.content == b.choices[0].message.content
    # usage details may differ (prefix-cache hits); the counts may not
    assert (a.usage.prompt_tokens, a.usage.completion_tokens) == (
        b.usage.prompt_tokens, b.usage.completion_tokens)
    streamed = "".join(c.choices[0].delta.content or "" for c in via.chat.completions.create(
        messages=msgs, stream=True, **kwargs) if c.choices)
    assert streamed == b.choices[0].message.content
    assert [m.id for m in via.models.list().data] == ["tiny-random"]


def test_prefill_decode_through_router_equals_unified(torch_fleet):
    engines, _, pd_router, _ = torch_fleet
    prompts = ["The capital of France is", "def fibonacci(n):\n    return", "x" * 40]
    for prompt in prompts:
        body = {"model": "tiny-random", "prompt": prompt, "max_tokens": 6, **GREEDY}
        want = json.loads(post_raw(engines[0].url, body)[1])["choices"][0]["text"]
        got = json.loads(post_raw(pd_router.url, body)[1])["choices"][0]["text"]
        assert got == want
        streamed = post_raw(pd_router.url, {**body, "prompt": prompt + " again",
                                            "stream": True})[1]
        assert streamed.endswith(b"data: [DONE]\n\n") and b'"error"' not in streamed
    assert metric_sum(pd_router.url, "kvfleet_router_pd_prefills_total") == 2 * len(prompts)
    assert metric_sum(pd_router.url, "kvfleet_router_pd_prefills_total", outcome="failed") == 0


def test_precise_mode_routes_token_prompts_by_engine_kv_events(torch_fleet):
    engines, _, _, precise_router = torch_fleet
    tokens = [(7 * i + 3) % 250 for i in range(64)]  # 4 full blocks of 16
    body = {"model": "tiny-random", "prompt": tokens, "max_tokens": 2, **GREEDY}
    time.sleep(1.0)  # let the router's /v1/kv_events subscriptions connect
    assert post_raw(engines[2].url, body)[0] == 200  # behind the router's back
    hits_before = metric_sum(engines[2].url, "vllm:prefix_cache_hits_total")
    time.sleep(0.5)  # the BlockStored events reach the router
    for i in range(3):
        assert post_raw(precise_router.url, {**body, "prompt": tokens + [i]})[0] == 200
    assert metric_sum(precise_router.url, "kvfleet_router_requests_total", endpoint="b2") == 3
    assert metric_sum(engines[2].url, "vllm:prefix_cache_hits_total") >= hits_before + 3 * 64


async def _stream(client: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> dict:
    record: dict = {"chunks": 0, "error": None, "finish": None}
    try:
        stream = await client.completions.create(model="tiny-random", prompt=prompt,
                                                 max_tokens=max_tokens, stream=True, temperature=0,
                                                 extra_body={"ignore_eos": True})
        async for chunk in stream:
            record["chunks"] += 1
            if chunk.choices and chunk.choices[0].finish_reason:
                record["finish"] = chunk.choices[0].finish_reason
    except openai.APIError as exc:
        record["error"] = exc
    return record


def sim_fleet(procs, tmp_path, **router_cfg):
    engines = start_engines(procs, [SIMULATED] * 3)
    cfg = {"version": 1, "endpoints": endpoints_cfg(engines), **router_cfg}
    return engines, start_router(procs, tmp_path, cfg)


def in_flight(router, name: str) -> int:
    status, got = http_json(router.url + "/admin/config", headers=admin_headers())
    return next(e["num_in_flight"] for e in got["endpoints"] if e["name"] == name)


async def wait_busy(router, name: str, timeout_s: float) -> None:
    """Until the router reports a request in flight on endpoint `name`."""
    deadline = time.monotonic() + timeout_s
    while await asyncio.to_thread(in_flight, router, name) == 0:
        assert time.monotonic() < deadline, f"{name} never got a request"
        await asyncio.sleep(0.05)


class StreamLoad:
    """Workers streaming back to back through the router until `stop()`; every stream kept."""

    def __init__(self, router, label: str, max_tokens: int, num_workers: int = 6) -> None:
        self.client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x",
                                         max_retries=0, timeout=60)
        self.records: list[dict] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._worker(label, w, max_tokens))
                       for w in range(num_workers)]

    async def _worker(self, label: str, w: int, max_tokens: int) -> None:
        n = 0
        while not self._stop.is_set():
            self.records.append(await _stream(self.client, f"{label} {w} {n} " * 4, max_tokens))
            n += 1

    async def stop(self) -> list[dict]:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.client.close()
        return self.records


async def test_killing_an_engine_mid_load_loses_no_request(procs, tmp_path):
    """Streams not started retry elsewhere; streams the killed engine was answering
    continue on another one (request migration): every stream ends whole."""
    engines, router = sim_fleet(procs, tmp_path, retries={"max_attempts": 3},
                                health={"probe_interval_s": 0.5, "eject_after_errors": 1})
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0,
                                timeout=60)
    tasks = []
    for i in range(24):  # staggered, so some start after the kill
        tasks.append(asyncio.create_task(_stream(client, f"load {i} " * 8, 250)))
        await asyncio.sleep(0.05)
        if i == 11:
            await wait_busy(router, "b0", timeout_s=10)
            engines[0].kill()
    records = await asyncio.gather(*tasks)
    assert all(r["error"] is None and r["finish"] == "length" for r in records), \
        [r["error"] for r in records if r["error"] is not None]
    migrated = await asyncio.to_thread(metric_sum, router.url,
                                       "kvfleet_router_migrations_total", outcome="continued")
    assert migrated > 0, "the killed engine had no stream in flight; the test proved nothing"
    after = await asyncio.gather(*(_stream(client, f"after {i}", 20) for i in range(9)))
    assert all(r["error"] is None and r["finish"] == "length" for r in after)
    await client.close()


async def test_draining_push_under_load_finishes_streams_and_sends_nothing_new(procs, tmp_path):
    engines, router = sim_fleet(procs, tmp_path)
    load = StreamLoad(router, "drain", max_tokens=150)
    await wait_busy(router, "b0", timeout_s=15)
    cfg = http_json(router.url + "/admin/config", headers=admin_headers())[1]["config"]
    cfg["version"] = 2
    cfg["endpoints"][0]["state"] = "draining"
    status, _ = await asyncio.to_thread(http_json, router.url + "/admin/config", cfg, "PUT",
                                        admin_headers())
    assert status == 200
    sent_at_push = metric_sum(router.url, 'kvfleet_router_requests_total', endpoint="b0")
    draining_in_flight = in_flight(router, "b0")
    await asyncio.sleep(2.5)
    records = await load.stop()
    assert all(r["error"] is None and r["finish"] == "length" for r in records)
    assert sent_at_push > 0 and draining_in_flight > 0
    assert metric_sum(router.url, 'kvfleet_router_requests_total', endpoint="b0") == sent_at_push
    assert in_flight(router, "b0") == 0
    # the engine itself finished exactly what it had been sent: nothing new, nothing lost
    assert metric_sum(engines[0].url, "vllm:e2e_request_latency_seconds_count") == sent_at_push
    assert metric_sum(router.url, 'kvfleet_router_requests_total', endpoint="b1") > 0


async def test_engine_sigterm_under_load_loses_nothing(procs, tmp_path):
    import signal

    engines, router = sim_fleet(procs, tmp_path, retries={"max_attempts": 3},
                                signals={"poll_interval_s": 0.2, "stale_after_s": 1.0},
                                health={"probe_interval_s": 0.2})
    load = StreamLoad(router, "sigterm", max_tokens=100)
    await wait_busy(router, "b0", timeout_s=15)
    engines[0].signal(signal.SIGTERM)  # what Kubernetes does to a pod before the operator acts
    await asyncio.sleep(3.0)
    records = await load.stop()
    assert records and all(r["error"] is None and r["finish"] == "length" for r in records)
    assert await asyncio.to_thread(engines[0].wait, 30) == 0
    # the engine's streams that were running at SIGTERM finished; later work went elsewhere
    assert metric_sum(router.url, "kvfleet_router_requests_total", endpoint="b0") >= 1
    assert in_flight(router, "b0") == 0
