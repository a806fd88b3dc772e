"""A bounded load generator for fleet tests: N concurrent streaming chat clients for T seconds.

It uses the real `openai` client. Each request is classified:
- ok: HTTP 2xx and the stream ended with a finish_reason;
- http_error: the server answered non-2xx (APIStatusError);
- broken: the stream raised mid-way or ended without a finish_reason.

Each failure keeps its exception type, so a test can tell a clean error (the router's SSE
error event, which the client raises as a plain `openai.APIError`) from a hang or a reset.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import openai


@dataclass(slots=True)
class LoadResult:
    num_ok: int = 0
    num_http_errors: int = 0
    num_broken: int = 0
    errors: list[str] = field(default_factory=list)
    error_types: list[str] = field(default_factory=list)

    @property
    def num_failed(self) -> int:
        return self.num_http_errors + self.num_broken

    def note(self, kind: str, message: str, error_type: str = "") -> None:
        if kind == "http":
            self.num_http_errors += 1
        else:
            self.num_broken += 1
        self.error_types.append(error_type)
        if len(self.errors) < 20:
            self.errors.append(f"{kind}: {error_type}: {message}")


async def _one_request(client: openai.AsyncOpenAI, model: str, max_tokens: int, i: int,
                       prompt_chars: int, result: LoadResult) -> None:
    # A unique head defeats prefix caching; the padding sets the prompt length.
    text = f"request {i}: tell me a short story. "
    text += "once upon a time " * max(0, (prompt_chars - len(text)) // 17)
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": text}],
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
        )
        finish = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        if finish is None:
            result.note("broken", f"request {i}: stream ended without finish_reason")
        else:
            result.num_ok += 1
    except openai.APIStatusError as exc:
        result.note("http", f"request {i}: HTTP {exc.status_code}: {exc.message}",
                    type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - every failure is data for the test
        result.note("broken", f"request {i}: {exc}", type(exc).__name__)


async def run_load(base_url: str, model: str, *, concurrency: int, duration_s: float,
                   max_tokens: int = 16, prompt_chars: int = 64,
                   timeout_s: float = 120.0, until: threading.Event | None = None) -> LoadResult:
    """Keep `concurrency` requests in flight for `duration_s` (or until `until` is set, from
    another thread), then wait for the last ones."""
    result = LoadResult()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0,
                                timeout=timeout_s)
    deadline = time.monotonic() + duration_s
    counter = iter(range(10**9))

    async def worker() -> None:
        while time.monotonic() < deadline and not (until is not None and until.is_set()):
            await _one_request(client, model, max_tokens, next(counter), prompt_chars, result)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return result
