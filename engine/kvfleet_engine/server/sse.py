"""Server-sent events framing, as OpenAI's streaming API and its clients expect it."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies must not buffer a token stream
}


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def open_sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers=SSE_HEADERS)
    response.enable_chunked_encoding()
    await response.prepare(request)
    return response
