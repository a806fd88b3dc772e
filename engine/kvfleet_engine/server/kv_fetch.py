"""Decode side of the KV hand-off: pull one frame from a prefill replica over HTTP.

The frame format and its checks are `core.kv_transfer`; this is only the bounded GET.
"""

from __future__ import annotations

import aiohttp

from kvfleet_engine.core.kv_transfer import KVTransferError


async def fetch_frame(url: str, *, timeout_s: float, token: str = "",
                      session: aiohttp.ClientSession | None = None) -> bytes:
    """GET a KV frame. Every failure (refused, reset, slow, non-200) is a KVTransferError."""
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 5.0),
                                    sock_read=min(timeout_s, 10.0))
    own = session is None
    session = session or aiohttp.ClientSession()
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with session.get(url, timeout=timeout, headers=headers) as resp:
            if resp.status != 200:
                detail = (await resp.text())[:300]
                raise KVTransferError(f"prefill replica answered {resp.status}: {detail}")
            return await resp.read()
    except TimeoutError:
        raise KVTransferError(f"KV transfer from {url} timed out after {timeout_s}s",
                              is_timeout=True) from None
    except aiohttp.ClientError as exc:
        raise KVTransferError(f"KV transfer from {url} failed: {exc!r}") from None
    finally:
        if own:
            await session.close()
