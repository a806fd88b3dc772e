"""Pull one KV frame from another replica over HTTP: the P/D hand-off's GET and the peer
prefix export's POST.

The frame format and its checks are `core.kv_transfer`; this is only the bounded request.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from kvfleet_engine.core.kv_transfer import KVTransferError


async def fetch_frame(url: str, *, timeout_s: float, token: str = "",
                      session: aiohttp.ClientSession | None = None,
                      json_body: Any = None, max_bytes: int | None = None) -> bytes:
    """GET a KV frame (POST `json_body` when given). Every failure (refused, reset, slow,
    non-200, more than `max_bytes`) is a KVTransferError; a non-200 carries its status."""
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 5.0),
                                    sock_read=min(timeout_s, 10.0))
    own = session is None
    session = session or aiohttp.ClientSession()
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        method = "GET" if json_body is None else "POST"
        async with session.request(method, url, timeout=timeout, headers=headers,
                                   json=json_body) as resp:
            if resp.status != 200:
                detail = (await resp.content.read(300)).decode(errors="replace")
                raise KVTransferError(f"peer replica answered {resp.status}: {detail}",
                                      status=resp.status)
            if max_bytes is None:
                return await resp.read()
            return await _read_bounded(resp, max_bytes)
    except TimeoutError:
        raise KVTransferError(f"KV transfer from {url} timed out after {timeout_s}s",
                              is_timeout=True) from None
    except aiohttp.ClientError as exc:
        raise KVTransferError(f"KV transfer from {url} failed: {exc!r}",
                              is_unreachable=True) from None
    finally:
        if own:
            await session.close()


async def _read_bounded(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    too_large = KVTransferError(f"KV frame exceeds {max_bytes} bytes")
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise too_large
    parts, size = [], 0
    async for part in resp.content.iter_chunked(1 << 20):
        size += len(part)
        if size > max_bytes:
            raise too_large
        parts.append(part)
    return b"".join(parts)
