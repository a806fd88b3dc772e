"""Steady open-loop load for the chaos soak: a fixed rate of requests, each one recorded.

Requests cycle through four shapes (completions and chat, streamed and not) and through the
router replicas. Each gets a unique prompt (no prefix cache hides a fault) and greedy
decoding. Outcomes:

- `ok`: 200, and for a stream a `finish_reason` and a final `data: [DONE]`, with no error
  event; for a plain answer a `finish_reason` in the JSON;
- `http_<status>`: a non-2xx answer;
- `error_event`: the stream carried an SSE `error` object (the router gave up mid-stream);
- `incomplete`: the stream or body ended without its finish (cut short);
- `connection`: the connection failed or was reset; `timeout`: no answer in time.

`migrated` is the router's per-answer count when it sends one (a response header whose name
starts with `x-kvfleet-migrat`); otherwise the soak reads the routers' migration counters.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

SHAPES = ("completion_stream", "chat_stream", "completion", "chat")
MIGRATION_HEADER_PREFIX = "x-kvfleet-migrat"
REFUSED = "ClientConnectorError"  # the connection was refused: no byte of the request left


@dataclass(slots=True)
class Outcome:
    index: int
    shape: str
    router: int
    start_s: float  # seconds since the load began
    end_s: float = 0.0
    outcome: str = "ok"
    detail: str = ""
    migrated: int | None = None  # None: the router said nothing per request
    rerouted: bool = False  # its first router refused the connection; sent to the next one

    @property
    def is_ok(self) -> bool:
        return self.outcome == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _body(shape: str, index: int, model: str, max_tokens: int) -> dict[str, Any]:
    text = f"chaos request {index}: tell me about the sea, in order. " + "tide " * (index % 7)
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0,
                            "stream": shape.endswith("_stream")}
    if shape.startswith("chat"):
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def _migrations(headers: Any) -> int | None:
    for name, value in headers.items():
        if name.lower().startswith(MIGRATION_HEADER_PREFIX):
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _read_stream(resp: aiohttp.ClientResponse, out: Outcome) -> None:
    finish = None
    is_done = False
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                is_done = True
                continue
            try:
                event = json.loads(data)
            except ValueError:
                out.outcome, out.detail = "incomplete", f"unparseable event {data[:80]!r}"
                return
            if "error" in event:
                out.outcome = "error_event"
                out.detail = str(event["error"].get("message", event["error"]))[:200]
                return
            for choice in event.get("choices") or []:
                finish = choice.get("finish_reason") or finish
    if finish is None or not is_done:
        out.outcome = "incomplete"
        out.detail = f"finish_reason={finish} [DONE]={is_done}"


async def one_request(http: aiohttp.ClientSession, base_url: str, shape: str, index: int,
                      router: int, t0: float, model: str, max_tokens: int,
                      timeout_s: float) -> Outcome:
    out = Outcome(index, shape, router, time.monotonic() - t0)
    path = "/v1/chat/completions" if shape.startswith("chat") else "/v1/completions"
    try:
        async with asyncio.timeout(timeout_s):
            async with http.post(base_url + path,
                                 json=_body(shape, index, model, max_tokens)) as resp:
                out.migrated = _migrations(resp.headers)
                if resp.status != 200:
                    out.outcome = f"http_{resp.status}"
                    out.detail = (await resp.text())[:200]
                elif shape.endswith("_stream"):
                    await _read_stream(resp, out)
                else:
                    answer = await resp.json(content_type=None)
                    choices = answer.get("choices") or [{}]
                    if not choices[0].get("finish_reason"):
                        out.outcome, out.detail = "incomplete", "no finish_reason"
    except TimeoutError:
        out.outcome, out.detail = "timeout", f"no whole answer in {timeout_s:g}s"
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        out.outcome, out.detail = "connection", f"{type(exc).__name__}: {exc}"[:200]
    out.end_s = time.monotonic() - t0
    return out


@dataclass(slots=True)
class SteadyLoad:
    """`rate` requests per second until `stop()`; `in_flight[r]` counts router r's open ones."""

    router_urls: list[str]
    model: str
    rate: float
    max_tokens: tuple[int, int] = (16, 48)
    timeout_s: float = 120.0
    shapes: tuple[str, ...] = SHAPES
    outcomes: list[Outcome] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    t0: float = 0.0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self) -> None:
        self._stop.set()

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    async def run(self) -> list[Outcome]:
        self.in_flight = [0] * len(self.router_urls)
        self.t0 = time.monotonic()
        tasks: set[asyncio.Task[None]] = set()
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=conn) as http:
            index = 0
            while not self._stop.is_set():
                router = index % len(self.router_urls)
                shape = self.shapes[(index // len(self.router_urls)) % len(self.shapes)]
                lo, hi = self.max_tokens
                max_tokens = lo + (index * 7919) % (hi - lo + 1)
                task = asyncio.create_task(self._one(http, shape, index, router, max_tokens))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                index += 1
                next_at = self.t0 + index / self.rate
                with_stop = asyncio.create_task(self._stop.wait())
                await asyncio.wait({with_stop}, timeout=max(0.0, next_at - time.monotonic()))
                with_stop.cancel()
            if tasks:
                await asyncio.gather(*tasks)
        self.outcomes.sort(key=lambda o: o.index)
        return self.outcomes

    async def _send(self, http: aiohttp.ClientSession, shape: str, index: int, router: int,
                    max_tokens: int) -> Outcome:
        """One request through router replica `router`, counted in flight there."""
        self.in_flight[router] += 1
        try:
            return await one_request(http, self.router_urls[router], shape, index, router,
                                     self.t0, self.model, max_tokens, self.timeout_s)
        finally:
            self.in_flight[router] -= 1

    async def _one(self, http: aiohttp.ClientSession, shape: str, index: int, router: int,
                   max_tokens: int) -> None:
        out = await self._send(http, shape, index, router, max_tokens)
        if out.outcome == "connection" and out.detail.startswith(REFUSED):
            # Nothing was sent: a Service (or a client's retry) takes the next replica, as a
            # Kubernetes Service stops sending to a dead pod. Only the first try counts.
            start_s = out.start_s
            router = (router + 1) % len(self.router_urls)
            out = await self._send(http, shape, index, router, max_tokens)
            out.start_s, out.rerouted = start_s, True
        self.outcomes.append(out)
