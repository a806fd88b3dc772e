"""Client disconnects, the queue limit, and SIGTERM drain, against live engine processes."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any

import aiohttp
import pytest
from engine_fixtures import TINY, start_engine
from prometheus_client.parser import text_string_to_metric_families

LONG = {"model": "tiny-random", "prompt": "a long story", "max_tokens": 480, "temperature": 0,
        "ignore_eos": True, "stream": True}


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, sample.value)
    return values


async def read_stream(resp: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """All SSE payloads up to [DONE]."""
    events = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            break
        events.append(json.loads(line[6:]))
    return events


async def test_client_disconnect_aborts_and_frees_blocks(tiny_engine):
    engine = tiny_engine
    async with aiohttp.ClientSession() as session:
        before = await scrape(session, engine.url)
        # a bare socket, so the test controls exactly when the connection drops
        reader, writer = await asyncio.open_connection("127.0.0.1", engine.port)
        body = json.dumps({**LONG, "prompt": "x" * 30}).encode()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        received = b""
        while received.count(b"data: ") < 3:
            received += await asyncio.wait_for(reader.read(4096), 30)
        during = await scrape(session, engine.url)
        writer.close()
        deadline = time.monotonic() + 10
        after = await scrape(session, engine.url)
        while time.monotonic() < deadline and (
            after["vllm:kv_cache_usage_perc"] != before["vllm:kv_cache_usage_perc"]
            or after["vllm:num_requests_running"] != 0
        ):
            await asyncio.sleep(0.05)
            after = await scrape(session, engine.url)
    assert during["vllm:kv_cache_usage_perc"] > before["vllm:kv_cache_usage_perc"]
    assert after["vllm:kv_cache_usage_perc"] == before["vllm:kv_cache_usage_perc"]
    assert after["vllm:num_requests_running"] == 0
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < 480, "the request ran to the end: it was not aborted"


async def test_queue_limit_answers_503_with_retry_after(procs):
    # simulated H100 timing (~6 ms a step): the running stream lasts seconds, not a blink
    engine = start_engine(procs, "--runner", "simulated", "--profile", "h100-llama3-8b",
                          "--served-model-name", "tiny-random", "--max-num-seqs", "1",
                          "--max-queue", "1")
    url = engine.url + "/v1/completions"
    async with aiohttp.ClientSession() as session:
        # headers come with the first token, so the queued stream is a task, not awaited
        first = asyncio.create_task(session.post(url, json=LONG))  # runs
        second = asyncio.create_task(session.post(url, json=LONG))  # waits for the first
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = await scrape(session, engine.url)
            if (now["vllm:num_requests_running"], now["vllm:num_requests_waiting"]) == (1, 1):
                break
            await asyncio.sleep(0.01)
        async with session.post(url, json={**LONG, "stream": False}) as third:
            status, headers, body = third.status, third.headers, await third.json()
        responses = await asyncio.gather(first, second)
        assert [r.status for r in responses] == [200, 200]
        done = await asyncio.gather(*(read_stream(r) for r in responses))
        for r in responses:
            r.release()
    assert status == 503
    assert int(headers["Retry-After"]) >= 1
    assert body["error"]["type"] == "overloaded_error" and body["error"]["code"] == "queue_full"
    for events in done:  # the admitted two are unharmed
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(1 for e in events for c in e["choices"] if c["text"]) > 0


@pytest.mark.timeout(180)
async def test_sigterm_drains_eight_live_streams_then_exits_zero(procs):
    engine = start_engine(procs, *TINY, "--drain-timeout", "120")
    url = engine.url + "/v1/completions"
    async with aiohttp.ClientSession() as session:
        streams = [await session.post(url, json={**LONG, "max_tokens": 400}) for _ in range(8)]
        assert all(s.status == 200 for s in streams)
        firsts = [await s.content.readuntil(b"\n\n") for s in streams]  # all 8 are live
        assert all(f.startswith(b"data: ") for f in firsts)
        engine.signal(signal.SIGTERM)
        health_status, health = None, None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and health_status != 503:
            async with session.get(engine.url + "/health") as resp:
                health_status, health = resp.status, await resp.json()
        async with session.post(url, json={**LONG, "stream": False}) as late:
            late_status, late_body = late.status, await late.json()
        rests = await asyncio.gather(*(read_stream(s) for s in streams))
    assert (health_status, health) == (503, {"status": "draining"})
    assert late_status == 503 and late_body["error"]["code"] == "draining"
    for first, rest in zip(firsts, rests, strict=True):
        events = [json.loads(first.decode()[6:]), *rest]
        assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert engine.wait(60) == 0


async def test_drain_timeout_cuts_stragglers_and_still_exits_zero(procs):
    engine = start_engine(procs, "--runner", "simulated", "--profile", "h100-llama3-8b",
                          "--drain-timeout", "0.5")
    async with aiohttp.ClientSession() as session:
        resp = await session.post(engine.url + "/v1/completions",
                                  json={**LONG, "max_tokens": 2000, "model": None})
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")
        started = time.monotonic()
        engine.signal(signal.SIGTERM)
        with pytest.raises(aiohttp.ClientPayloadError):
            await read_stream(resp)
    assert engine.wait(30) == 0
    assert time.monotonic() - started < 15


async def test_priority_field_orders_the_queue(procs):
    engine = start_engine(procs, "--runner", "simulated", "--profile", "h100-llama3-8b",
                          "--served-model-name", "tiny-random", "--max-num-seqs", "1")
    url = engine.url + "/v1/completions"
    finished: list[str] = []

    async def run(session: aiohttp.ClientSession, name: str, body: dict) -> None:
        async with session.post(url, json=body) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()
        finished.append(name)

    async def wait_for(session: aiohttp.ClientSession, running: int, waiting: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = await scrape(session, engine.url)
            if (now["vllm:num_requests_running"], now["vllm:num_requests_waiting"]) == (
                    running, waiting):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"never saw running={running} waiting={waiting}")

    short = {**LONG, "stream": False, "max_tokens": 5}
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(run(session, "blocker", {**LONG, "stream": False,
                                                              "max_tokens": 300}))]
        await wait_for(session, 1, 0)
        tasks.append(asyncio.create_task(run(session, "low", {**short, "priority": 5})))
        await wait_for(session, 1, 1)
        tasks.append(asyncio.create_task(run(session, "high", {**short, "priority": -5})))
        await wait_for(session, 1, 2)
        await asyncio.gather(*tasks)
    # vLLM's convention, a lower value first: "high" takes the blocker's seat at once (the
    # blocker is preempted by recompute and resumes), "low" waits for both
    assert finished == ["high", "blocker", "low"]
