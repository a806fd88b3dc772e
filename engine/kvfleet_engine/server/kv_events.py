"""GET /v1/kv_events: the engine's prefix-cache changes as NDJSON, one KVEvent per line.

The hub keeps a bounded backlog so a reader can resume with `?since=<seq>` (events with
a larger seq follow). Sequence numbers come from the engine and rise by one per event,
so a reader that sees a jump knows it missed events and must resynchronise. A reader
too slow to keep up is disconnected rather than allowed to grow memory.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

from aiohttp import web

from kvfleet_engine.server.errors import bad_request, check_bearer
from kvfleet_engine.server.state import STATE_KEY

NDJSON = "application/x-ndjson"
_CLOSE = b""  # sentinel: the hub is shutting down


class KVEventHub:
    def __init__(self, *, max_backlog: int = 10_000, max_pending_per_reader: int = 10_000) -> None:
        self._backlog: deque[tuple[int, bytes]] = deque(maxlen=max_backlog)
        self._readers: set[asyncio.Queue[bytes]] = set()
        self._max_pending = max_pending_per_reader
        self.is_closed = False

    @property
    def last_seq(self) -> int:
        return self._backlog[-1][0] if self._backlog else -1

    def publish(self, events: list[Any]) -> None:
        for event in events:
            line = json.dumps(event.to_dict(), separators=(",", ":")).encode() + b"\n"
            self._backlog.append((event.seq, line))
            for reader in list(self._readers):
                if reader.qsize() >= self._max_pending:
                    self._readers.discard(reader)  # too slow: cut it off, it will see a gap
                    reader.put_nowait(_CLOSE)
                else:
                    reader.put_nowait(line)

    def subscribe(self, since: int) -> tuple[list[bytes], asyncio.Queue[bytes]]:
        """Backlog lines after `since`, and a queue of everything published from now on."""
        backlog = [line for seq, line in self._backlog if seq > since]
        reader: asyncio.Queue[bytes] = asyncio.Queue()
        if self.is_closed:
            reader.put_nowait(_CLOSE)
        else:
            self._readers.add(reader)
        return backlog, reader

    def unsubscribe(self, reader: asyncio.Queue[bytes]) -> None:
        self._readers.discard(reader)

    def close(self) -> None:
        self.is_closed = True
        for reader in self._readers:
            reader.put_nowait(_CLOSE)
        self._readers.clear()


async def handle_kv_events(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    check_bearer(request.headers.get("Authorization"), state.settings.internal_token)
    hub: KVEventHub = state.kv_events
    raw_since = request.query.get("since", "-1")
    try:
        since = int(raw_since)
    except ValueError:
        raise bad_request("`since` must be an integer sequence number", param="since") from None
    backlog, reader = hub.subscribe(since)
    response = web.StreamResponse(headers={"Content-Type": NDJSON, "Cache-Control": "no-cache"})
    response.enable_chunked_encoding()
    try:
        await response.prepare(request)
        if backlog:
            await response.write(b"".join(backlog))
        while True:
            line = await reader.get()
            if line == _CLOSE:
                break
            await response.write(line)
    finally:
        hub.unsubscribe(reader)
    await response.write_eof()
    return response
