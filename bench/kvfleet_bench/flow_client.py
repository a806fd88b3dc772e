"""Tenant load for bench/flow_control.py: streamed completions tagged with a tenant, sent
open-loop (Poisson) or closed-loop, every outcome kept.

Each request is one `Outcome`: when it started and ended (seconds after the run's t0), its
time to first token (the first body chunk of the stream: the router sends nothing before it
dispatches), its HTTP status and, for a refusal, the reason the router gave
(`x-kvfleet-drop-reason`, or the OpenAI error `code`/`type` of a quota refusal). A request
that neither succeeded nor was refused with 429/503 and a reason is `is_unexplained`: the
benchmark's "nothing lost" count.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvfleet_bench import loadgen

DROP_REASON_HEADER = "x-kvfleet-drop-reason"
TENANT_HEADER = "x-kvfleet-tenant"
KEPT_HEADERS = ("retry-after", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests", "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens", DROP_REASON_HEADER)


@dataclass(slots=True)
class Outcome:
    tenant: str
    start_s: float
    end_s: float
    ttft_s: float = math.nan
    status: int = 0  # 0: no HTTP answer (connection error, client timeout)
    reason: str = ""  # a refusal's reason; the error kind for anything else that failed
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    error: dict | None = None  # a refusal's OpenAI error object
    headers: dict[str, str] = field(default_factory=dict)  # KEPT_HEADERS that were present

    @property
    def is_ok(self) -> bool:
        return self.status == 200 and not self.reason

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_completion_tokens

    @property
    def is_refused(self) -> bool:
        """429 or 503 with a stated reason: the router's answer, not a loss."""
        return self.status in (429, 503) and bool(self.reason)

    @property
    def is_unexplained(self) -> bool:
        return not self.is_ok and not self.is_refused


def request_body(model: str, prompt: str, max_tokens: int) -> bytes:
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "stream": True, "stream_options": {"include_usage": True},
                       "ignore_eos": True}).encode()


def _usage(body: bytes) -> tuple[int, int, int]:
    """(prompt tokens, completion tokens, content events) from an SSE body."""
    prompt = completion = events = 0
    for line in body.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            continue
        if event.get("choices"):
            events += 1
        usage = event.get("usage")
        if usage:
            prompt = int(usage.get("prompt_tokens", 0))
            completion = int(usage.get("completion_tokens", 0))
    return prompt, completion, events


def _refusal(status: int, headers: dict[str, str], body: bytes) -> tuple[str, dict | None]:
    """The reason of an error answer and its OpenAI error object (None if it has none)."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if not isinstance(error, dict):
        error = None
    if reason := headers.get(DROP_REASON_HEADER, ""):
        return reason, error
    if error and error.get("code") == "rate_limit_exceeded":
        return f"quota-{error.get('type', '?')}", error
    if error and (error.get("code") or error.get("type")):
        return f"http {status} {error.get('code') or error.get('type')}", error
    return f"http {status}", error


async def send(session: aiohttp.ClientSession, url: str, tenant: str, body: bytes,
               t0: float) -> Outcome:
    """One streamed completion as `tenant`; never raises for an HTTP or network failure."""
    start = time.perf_counter()
    out = Outcome(tenant, start - t0, math.nan)
    try:
        async with session.post(url, data=body, headers={TENANT_HEADER: tenant}) as resp:
            out.status = resp.status
            out.headers = {k: resp.headers[k] for k in KEPT_HEADERS if k in resp.headers}
            parts: list[bytes] = []
            while chunk := await resp.content.readany():
                if not parts:
                    out.ttft_s = time.perf_counter() - start
                parts.append(chunk)
            whole = b"".join(parts)
        if out.status != 200:
            out.reason, out.error = _refusal(out.status, out.headers, whole)
        elif loadgen.DONE_MARK not in whole[-64:]:
            out.reason = "incomplete stream"
        else:
            prompt, completion, events = _usage(whole)
            out.num_prompt_tokens, out.num_completion_tokens = prompt, completion or events
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        out.reason = type(exc).__name__
    out.end_s = time.perf_counter() - t0
    return out


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """One tenant's load: open loop at `rate` req/s (Poisson arrivals), or closed loop with
    `concurrency` requests always outstanding when `rate` is 0."""

    tenant: str
    rate: float = 0.0
    concurrency: int = 0
    max_tokens: int = 32
    prompt_chars: int = 256

    def __post_init__(self) -> None:
        if (self.rate > 0) == (self.concurrency > 0):
            raise ValueError(f"tenant {self.tenant}: give a rate or a concurrency, not both")
        if self.max_tokens < 1 or self.prompt_chars < 8:
            raise ValueError(f"tenant {self.tenant}: max_tokens >= 1 and prompt_chars >= 8")


def prompt_text(tenant: str, n: int, num_chars: int, run: str = "") -> str:
    """A prompt of `num_chars` characters that shares no leading block with any other (the
    request's id and its run's tag come first), so prefix caching never shortens a
    prefill: not one tenant's, nor the same request's in the next run on the same engines
    (which would favour whichever configuration of a pair runs second)."""
    head = f"{tenant} {run}request {n}: "
    filler = "the quick brown fox jumps over the lazy dog " * (num_chars // 44 + 1)
    return (head + filler)[:num_chars]


async def run_loads(url: str, model: str, loads: list[TenantLoad], duration_s: float,
                    seed: int = 0, timeout_s: float = 120.0) -> list[Outcome]:
    """Drive every load for `duration_s`, then wait for what is still in flight."""
    outcomes: list[Outcome] = []
    t0 = time.perf_counter()
    t_end = t0 + duration_s
    run = f"{uuid.uuid4().hex[:8]} "  # this run's prompts are new to the engines

    def body_for(load: TenantLoad, n: int) -> bytes:
        return request_body(model, prompt_text(load.tenant, n, load.prompt_chars, run),
                            load.max_tokens)

    async def one(load: TenantLoad, n: int, session: aiohttp.ClientSession) -> None:
        outcomes.append(await send(session, url, load.tenant, body_for(load, n), t0))

    async def open_loop(load: TenantLoad, rng: random.Random,
                        session: aiohttp.ClientSession) -> None:
        tasks, n = [], 0
        t_next = t0 + rng.expovariate(load.rate)
        while t_next < t_end:
            await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
            tasks.append(asyncio.create_task(one(load, n, session)))
            n += 1
            t_next += rng.expovariate(load.rate)
        await asyncio.gather(*tasks)

    async def closed_loop(load: TenantLoad, worker: int, session: aiohttp.ClientSession) -> None:
        n = worker
        while time.perf_counter() < t_end:
            await one(load, n, session)
            n += load.concurrency

    async with loadgen.new_session(timeout_s) as session:
        jobs: list[Coroutine[Any, Any, None]] = []
        for i, load in enumerate(loads):
            if load.rate > 0:
                jobs.append(open_loop(load, random.Random(seed * 1009 + i), session))
            else:
                jobs += [closed_loop(load, w, session) for w in range(load.concurrency)]
        await asyncio.gather(*jobs)
    return outcomes
