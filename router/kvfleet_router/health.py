"""Active /health probes. Passive ejection lives in breaker.py and is fed by the proxy."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from kvfleet_router.endpoint import EndpointState


async def probe(session: aiohttp.ClientSession, e: EndpointState, timeout_s: float) -> bool:
    try:
        async with session.get(e.url + "/health",
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            await resp.read()
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


async def probe_forever(session: aiohttp.ClientSession,
                        endpoints: Callable[[], list[EndpointState]],
                        interval_s: Callable[[], float], timeout_s: Callable[[], float],
                        on_change: Callable[[], None]) -> None:
    while True:
        eps = endpoints()
        results = await asyncio.gather(*(probe(session, e, timeout_s()) for e in eps))
        changed = False
        for e, ok in zip(eps, results, strict=True):
            changed |= ok != e.is_probe_healthy
            e.is_probe_healthy = ok
        if changed:
            on_change()
        await asyncio.sleep(interval_s())
