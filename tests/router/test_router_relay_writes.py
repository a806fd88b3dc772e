"""The router's hot path writes as little as it can and keeps every behaviour (issue 29
item 4): a stream whose backend body ended with its last bytes reaches the client in one
write (headers, data and the end of the chunked body); the headers still leave as soon as
the backend's first bytes arrive, even when those are half an event (migration holds them
back); a body already received whole is read without an upload slot, while an unfinished
one still takes one (the per-address cap). Router and backends run in process."""

from __future__ import annotations

import asyncio
import json
import socket
from collections import defaultdict

import pytest
from aiohttp import http_writer, web
from aiohttp.test_utils import TestClient, TestServer
from kvfleet_engine.contract.http_limits import UploadSlots
from kvfleet_router.app import RouterApp
from kvfleet_router.config import LimitsConfig, RouterConfig
from kvfleet_router.errors import json_errors
from kvfleet_router.front import read_body
from router_fixtures import in_process_backend

EVENTS = [{"id": "c1", "object": "text_completion", "model": "m",
           "choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in ("a", "b")]
STREAM = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in EVENTS) \
    + b"data: [DONE]\n\n"


@pytest.fixture
def writes(monkeypatch):
    """Every write of every aiohttp StreamWriter in this process: writer -> [bytes, ...]
    (a writelines call is one write: aiohttp sends it as one)."""
    seen: dict[int, list[bytes]] = defaultdict(list)
    write, writelines = http_writer.StreamWriter._write, http_writer.StreamWriter._writelines

    def spy_write(self, chunk):  # type: ignore[no-untyped-def]
        seen[id(self)].append(bytes(chunk))
        return write(self, chunk)

    def spy_writelines(self, chunks):  # type: ignore[no-untyped-def]
        chunks = list(chunks)
        seen[id(self)].append(b"".join(bytes(c) for c in chunks))
        return writelines(self, chunks)

    monkeypatch.setattr(http_writer.StreamWriter, "_write", spy_write)
    monkeypatch.setattr(http_writer.StreamWriter, "_writelines", spy_writelines)
    return seen


def router_answers(seen: dict[int, list[bytes]]) -> list[list[bytes]]:
    """The writes of the router's streamed answers (the backend's carry X-Backend)."""
    return [w for w in seen.values() if w and w[0].startswith(b"HTTP/1.1 200")
            and b"text/event-stream" in w[0] and b"X-Backend" not in w[0]]


async def start(backend: web.Application, migration: bool = True):  # type: ignore[no-untyped-def]
    upstream = TestClient(TestServer(backend))
    await upstream.start_server()
    cfg = RouterConfig.from_dict({
        "endpoints": [{"name": "b0", "url": str(upstream.make_url("")).rstrip("/")}],
        "migration": {"enabled": migration}})
    router = TestClient(TestServer(RouterApp(cfg, "admin-token").build()))
    await router.start_server()
    return upstream, router


@pytest.mark.parametrize("migration", [True, False])
async def test_a_stream_the_backend_ended_reaches_the_client_in_one_write(writes, migration):
    async def completions(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Backend": "1"})
        await resp.prepare(request)
        await resp.write_eof(STREAM)  # the whole stream and the end of the body, one read
        return resp

    upstream, router = await start(in_process_backend(completions), migration)
    try:
        resp = await router.post("/v1/completions", json={"model": "m", "prompt": "p",
                                                          "stream": True})
        body = await resp.read()
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        assert body == STREAM  # untouched
        answers = router_answers(writes)
        assert len(answers) == 1
        assert len(answers[0]) == 1, answers[0]  # headers, the data, the last chunk: one write
        assert answers[0][0].endswith(b"\r\n0\r\n\r\n")
    finally:
        await router.close()
        await upstream.close()


async def test_headers_leave_with_the_first_bytes_even_half_an_event(writes):
    go_on = asyncio.Event()

    async def completions(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Backend": "1"})
        await resp.prepare(request)
        await resp.write(STREAM[:10])  # half an event: the migration ledger holds it back
        await go_on.wait()
        await resp.write(STREAM[10:])
        await resp.write_eof()
        return resp

    upstream, router = await start(in_process_backend(completions))
    try:
        # the status and headers arrive while the backend still waits
        resp = await asyncio.wait_for(router.post(
            "/v1/completions", json={"model": "m", "prompt": "p", "stream": True}), 5)
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        go_on.set()
        assert await resp.read() == STREAM
        [answer] = router_answers(writes)
        assert answer[0].endswith(b"\r\n\r\n") and b"data:" not in answer[0]  # headers alone
    finally:
        go_on.set()
        await router.close()
        await upstream.close()


async def test_a_body_received_whole_takes_no_upload_slot_an_unfinished_one_does():
    limits = LimitsConfig(max_uploads_per_client=1, body_read_timeout_s=2.0)
    uploads = UploadSlots(1)

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"size": len(await read_body(request, limits, uploads))})

    app = web.Application(middlewares=[json_errors])
    app.router.add_post("/", handler)
    server = TestServer(app)
    client = TestClient(server)
    await client.start_server()
    stalled = socket.create_connection((server.host, server.port))
    try:
        stalled.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"p\": \"")
        for _ in range(100):  # until the handler holds the address's one slot
            if uploads.in_use("127.0.0.1"):
                break
            await asyncio.sleep(0.02)
        assert uploads.in_use("127.0.0.1") == 1
        whole = await client.post("/", data=b'{"prompt": "x"}')  # same address, whole body
        assert whole.status == 200 and (await whole.json())["size"] == 15
        second = await client.post("/", data=_slow_body())  # unfinished: over the cap
        assert second.status == 429
        assert (await second.json())["error"]["code"] == "too_many_uploads"
    finally:
        stalled.close()
        await client.close()


async def _slow_body():  # type: ignore[no-untyped-def]
    yield b'{"prompt": "'
    await asyncio.sleep(0.5)
    yield b'x"}'


def test_strip_token_ids_is_the_lookbehind_rule_it_replaced():
    """The first-key pattern matches its `{` and puts it back (a literal start is found at
    C speed); on any bytes it must cut exactly what the look-behind form did."""
    import random
    import re

    from kvfleet_router.migration import _IDS_AFTER, strip_token_ids

    first = re.compile(rb'(?<={)\s*"(?:prompt_)?token_ids"\s*:\s*(?:\[[-0-9,\s]*\]|null)\s*,?')
    rng = random.Random(29)
    parts = [b"{", b"}", b",", b" ", b'"token_ids"', b'"prompt_token_ids"', b":", b"[1, 2]",
             b"null", b'"x"', b"\n", b"[", b"]", b"-", b'{ "token_ids": [4] ,', b'"a": 1']
    for _ in range(3000):
        raw = b"".join(rng.choice(parts) for _ in range(rng.randint(1, 30)))
        assert strip_token_ids(raw) == (first.sub(b"", _IDS_AFTER.sub(b"", raw))
                                        if b"token_ids" in raw else raw), raw
