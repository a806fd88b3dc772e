"""Prefill/decode disaggregation between two live engine processes, vLLM-style
kv_transfer_params, compared token for token with unified serving."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any

import aiohttp
import pytest
from engine_fixtures import TINY, start_engine
from kvfleet_engine import contract

PROMPTS = [
    "a",  # shorter than a block
    "sixteen bytes!!!",  # exactly one block
    "The capital of France is",
    "def fibonacci(n):\n    return",
    "x" * 33,  # two full blocks and one token
    "Once upon a time, in a land far away, there lived",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "Hello, world! " * 5,
    "🙂 unicode prompt ✓",
    "the end",
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def trio(procs, tiny_engine):
    unified = tiny_engine
    prefill = start_engine(procs, *TINY, "--role", "prefill")
    decode = start_engine(procs, *TINY, "--role", "decode", "--kv-transfer-timeout", "3")
    return unified, prefill, decode


def body(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny-random", "prompt": prompt, "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True, **extra}


async def post(session: aiohttp.ClientSession, url: str, payload: dict) -> tuple[int, dict]:
    async with session.post(url + "/v1/completions", json=payload) as resp:
        return resp.status, await resp.json()


async def metric(session: aiohttp.ClientSession, url: str, sample: str) -> float:
    async with session.get(url + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith(sample + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{sample} not found")


async def prefill_then_decode(session, prefill_url, decode_url, payload) -> tuple[dict, dict]:
    status, pre = await post(session, prefill_url,
                             {**payload, contract.KV_TRANSFER_PARAMS: {"do_remote_decode": True}})
    assert status == 200, pre
    status, dec = await post(session, decode_url,
                             {**payload, contract.KV_TRANSFER_PARAMS: pre["kv_transfer_params"]})
    assert status == 200, dec
    return pre, dec


async def test_disaggregated_output_equals_unified_for_ten_prompts(trio):
    unified, prefill, decode = trio
    async with aiohttp.ClientSession() as session:
        queries = contract.PREFIX_CACHE_QUERIES + "_total"
        hits = contract.PREFIX_CACHE_HITS + "_total"
        decode_before = [await metric(session, decode.url, m) for m in (queries, hits)]
        for prompt in PROMPTS:
            status, want = await post(session, unified.url, body(prompt))
            assert status == 200
            pre, got = await prefill_then_decode(session, prefill.url, decode.url, body(prompt))
            params = pre["kv_transfer_params"]
            assert params["do_remote_prefill"] is True
            assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", prefill.port)
            assert params["remote_handle"] and params["remote_block_ids"]
            assert pre["usage"]["completion_tokens"] == 1
            assert want["choices"][0]["text"].startswith(pre["choices"][0]["text"])
            assert got["choices"][0]["text"] == want["choices"][0]["text"], prompt
            assert got["usage"]["completion_tokens"] == MAX_TOKENS
            assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
        decode_after = [await metric(session, decode.url, m) for m in (queries, hits)]
        assert decode_after == decode_before  # preloaded KV is no prefix-cache traffic
        # every handle was claimed and its blocks freed on the prefill side
        assert await metric(session, prefill.url, contract.KV_CACHE_USAGE_PERC) == 0
        # a handle serves one decoder only
        status, again = await post(session, decode.url, {
            **body(PROMPTS[-1]), contract.KV_TRANSFER_PARAMS: pre["kv_transfer_params"]})
        assert status == 502 and again["error"]["type"] == "kv_transfer_error"


async def test_decode_side_can_stream(trio):
    unified, prefill, decode = trio
    prompt = PROMPTS[5]
    async with aiohttp.ClientSession() as session:
        _, want = await post(session, unified.url, body(prompt))
        _, pre = await post(session, prefill.url, {
            **body(prompt), contract.KV_TRANSFER_PARAMS: {"do_remote_decode": True}})
        payload = {**body(prompt, stream=True),
                   contract.KV_TRANSFER_PARAMS: pre["kv_transfer_params"]}
        text = ""
        async with session.post(decode.url + "/v1/completions", json=payload) as resp:
            assert resp.status == 200
            async for raw in resp.content:
                line = raw.decode().strip()
                if line.startswith("data: {"):
                    text += json.loads(line[6:])["choices"][0]["text"]
    assert text == want["choices"][0]["text"]


async def test_mismatched_prompt_is_refused(trio):
    _, prefill, decode = trio
    async with aiohttp.ClientSession() as session:
        _, pre = await post(session, prefill.url, {
            **body("one prompt"), contract.KV_TRANSFER_PARAMS: {"do_remote_decode": True}})
        status, err = await post(session, decode.url, {
            **body("another prompt"), contract.KV_TRANSFER_PARAMS: pre["kv_transfer_params"]})
    assert status == 502
    assert "different prompt" in err["error"]["message"]


async def test_killed_prefill_replica_gives_a_clean_error(procs):
    prefill = start_engine(procs, *TINY, "--role", "prefill")
    decode = start_engine(procs, *TINY, "--role", "decode", "--kv-transfer-timeout", "3")
    async with aiohttp.ClientSession() as session:
        _, pre = await post(session, prefill.url, {
            **body(PROMPTS[2]), contract.KV_TRANSFER_PARAMS: {"do_remote_decode": True}})
        prefill.kill()
        started = time.monotonic()
        status, err = await post(session, decode.url, {
            **body(PROMPTS[2]), contract.KV_TRANSFER_PARAMS: pre["kv_transfer_params"]})
        assert status == 502 and err["error"]["type"] == "kv_transfer_error"
        assert time.monotonic() - started < 10
        status, ok = await post(session, decode.url, body(PROMPTS[2]))  # decode still serves
        assert status == 200 and ok["usage"]["completion_tokens"] == MAX_TOKENS


async def _fake_prefill(behaviour: str) -> asyncio.Server:
    """A peer that dies or stalls mid-transfer: sends headers and half a body."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                     b"Content-Length: 100000\r\n\r\nKVT1" + b"\0" * 500)
        await writer.drain()
        if behaviour == "stall":
            await asyncio.sleep(60)
        writer.transport.abort()  # behaves like a SIGKILLed peer: connection reset

    return await asyncio.start_server(serve, "127.0.0.1", 0)


@pytest.mark.parametrize("behaviour, status", [("die", 502), ("stall", 504)])
async def test_prefill_lost_mid_transfer_fails_fast_without_hanging(trio, behaviour, status):
    _, _, decode = trio
    server = await _fake_prefill(behaviour)
    port = server.sockets[0].getsockname()[1]
    params = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": port,
              "remote_handle": "h", "remote_block_ids": [1]}
    try:
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            got_status, err = await post(session, decode.url, {
                **body(PROMPTS[0]), contract.KV_TRANSFER_PARAMS: params})
            elapsed = time.monotonic() - started
            running = await metric(session, decode.url, contract.NUM_REQUESTS_RUNNING)
    finally:
        server.close()
    assert got_status == status and err["error"]["type"] == "kv_transfer_error"
    assert elapsed < 10  # --kv-transfer-timeout 3
    assert running == 0


async def test_internal_endpoints_need_the_token_when_one_is_set(procs):
    sim = ("--runner", "simulated", "--profile", "cpu-tiny")
    token = {"KVFLEET_ENGINE_TOKEN": "s3cret-token"}
    prefill = start_engine(procs, *sim, "--role", "prefill", env=token)
    decode = start_engine(procs, *sim, "--role", "decode", env=token)
    stranger = start_engine(procs, *sim, "--role", "decode")  # has no token
    payload = {"prompt": "a prompt with secrets in it", "max_tokens": 4, "temperature": 0}
    async with aiohttp.ClientSession() as session:
        async with session.get(prefill.url + "/v1/kv_events") as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["type"] == "authentication_error"
        auth = {"Authorization": "Bearer s3cret-token"}
        async with session.get(prefill.url + "/v1/kv_events", headers=auth) as resp:
            assert resp.status == 200
        for decoder, want in ((stranger, 502), (decode, 200)):
            _, pre = await post(session, prefill.url, {
                **payload, contract.KV_TRANSFER_PARAMS: {"do_remote_decode": True}})
            status, out = await post(session, decoder.url, {
                **payload, contract.KV_TRANSFER_PARAMS: pre["kv_transfer_params"]})
            assert status == want, out
        assert out["usage"]["completion_tokens"] == 4


async def test_draining_prefill_waits_for_its_decoder_then_exits_zero(procs):
    sim = ("--runner", "simulated", "--profile", "cpu-tiny")
    prefill = start_engine(procs, *sim, "--role", "prefill", "--drain-timeout", "60",
                           "--kv-handle-ttl", "60")
    decode = start_engine(procs, *sim, "--role", "decode")
    payload = {"prompt": "held across a drain", "max_tokens": 5, "temperature": 0}
    async with aiohttp.ClientSession() as session:
        _, pre = await post(session, prefill.url, {
            **payload, contract.KV_TRANSFER_PARAMS: {"do_remote_decode": True}})
        prefill.signal(signal.SIGTERM)
        await asyncio.sleep(1.0)
        assert prefill.is_running()  # an unclaimed handle is work in flight
        async with session.get(prefill.url + "/health") as resp:
            assert resp.status == 503
        status, out = await post(session, decode.url, {
            **payload, contract.KV_TRANSFER_PARAMS: pre["kv_transfer_params"]})
        assert status == 200 and out["usage"]["completion_tokens"] == 5
    assert prefill.wait(30) == 0


async def test_chat_goes_through_pd_like_the_router_sends_it(trio):
    unified, prefill, decode = trio
    chat = {"model": "tiny-random", "messages": [{"role": "user", "content": "Hello there"}],
            "max_completion_tokens": 10, "temperature": 0, "ignore_eos": True}
    router_prefill = {**chat, "max_completion_tokens": 1, "max_tokens": 1, "stream": False,
                      contract.KV_TRANSFER_PARAMS: {
                          "do_remote_decode": True, "do_remote_prefill": False,
                          "remote_engine_id": None, "remote_block_ids": None,
                          "remote_host": None, "remote_port": None}}
    async with aiohttp.ClientSession() as session:
        async def chat_post(url: str, payload: dict) -> dict:
            async with session.post(url + "/v1/chat/completions", json=payload) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.json()

        want = await chat_post(unified.url, chat)
        pre = await chat_post(prefill.url, router_prefill)
        got = await chat_post(decode.url, {**chat, contract.KV_TRANSFER_PARAMS:
                                           pre["kv_transfer_params"]})
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    for key in ("prompt_tokens", "completion_tokens"):
        assert got["usage"][key] == want["usage"][key]
