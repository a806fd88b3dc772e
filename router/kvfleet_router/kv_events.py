"""Subscribe to a kvfleet engine's GET /v1/kv_events (NDJSON of contract.KVEvent) and feed
the precise prefix index. On disconnect the endpoint's index is reset (events were missed)
and the subscriber reconnects with capped backoff.

An endpoint that answers 404 there is taken for vLLM: its events come from vLLM's ZMQ
publisher instead (`vllm_kv_events.follow_vllm`, PUB on the HTTP port + 1, replay on + 2),
with replay over gaps. Both feed the same `PreciseKVIndex`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

import aiohttp
from kvfleet_engine.contract import ENGINE_TOKEN_ENV, KVEvent

from kvfleet_router.endpoint import EndpointState
from kvfleet_router.prefix_index import PreciseKVIndex

log = logging.getLogger(__name__)


class KVEventFollowers:
    """One `subscribe_forever` task per precise-mode endpoint, kept in step with the config."""

    def __init__(self, session: aiohttp.ClientSession, index: PreciseKVIndex) -> None:
        self._session = session
        self._index = index
        self._tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}

    def sync(self, endpoints: list[EndpointState]) -> None:
        wanted = {e.name: e.url for e in endpoints if e.prefix_mode == "precise"}
        for name, (url, task) in list(self._tasks.items()):
            if wanted.get(name) != url:
                task.cancel()
                del self._tasks[name]
        for name, url in wanted.items():
            if name not in self._tasks:
                task = asyncio.create_task(subscribe_forever(self._session, name, url,
                                                             self._index))
                self._tasks[name] = (url, task)

    def tasks(self) -> list[asyncio.Task[None]]:
        return [task for _, task in self._tasks.values()]


async def subscribe_forever(session: aiohttp.ClientSession, name: str, url: str,
                            index: PreciseKVIndex, max_backoff_s: float = 5.0) -> None:
    backoff = 0.2
    token = os.environ.get(ENGINE_TOKEN_ENV)  # engines that guard their KV events want it
    headers = {"Authorization": f"Bearer {token}"} if token else None
    is_vllm = False
    while True:
        try:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=2.0, sock_read=None)
            async with session.get(url + "/v1/kv_events", timeout=timeout,
                                   headers=headers) as resp:
                is_vllm = resp.status == 404
                if resp.status == 200:
                    backoff = 0.2
                    index.reset(name)
                    pending = b""  # own line splitting: long prompts make long lines
                    async for chunk in resp.content.iter_any():
                        *lines, pending = (pending + chunk).split(b"\n")
                        for line in lines:
                            apply_line(index, name, line)
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass
        if is_vllm:
            await _follow_vllm(name, url, index)  # returns only when it cannot follow
        is_vllm = False
        index.reset(name)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, max_backoff_s)


async def _follow_vllm(name: str, url: str, index: PreciseKVIndex) -> None:
    try:
        from kvfleet_router.vllm_kv_events import follow_vllm
    except ImportError:
        log.warning("kv_events from %s: vLLM's ZMQ events need pyzmq and msgpack "
                    "(pip install 'kvfleet[vllm-events]'); precise index stays empty", name)
        return
    try:
        await follow_vllm(name, url, index)
    except Exception as exc:  # a zmq or decoding failure must not end the follower
        log.warning("kv_events from %s: vLLM ZMQ follower stopped: %s", name, exc)


def apply_line(index: PreciseKVIndex, name: str, line: bytes) -> None:
    line = line.strip()
    if not line:
        return
    try:
        event = KVEvent.from_dict(json.loads(line))
    except (ValueError, KeyError, TypeError):
        log.warning("kv_events from %s: skipping a malformed line", name)
        return
    index.apply(name, event)
