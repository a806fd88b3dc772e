"""Forward one request to one endpoint and stream the answer back, bytes untouched.

`Forwarder.forward` either returns a response already (being) sent to the client, or raises
`BackendFailure` while nothing has reached the client, so the caller may retry elsewhere.
Non-streaming answers are buffered whole (small), so any failure there is still retryable.
A stream is committed to the client only once the backend's first body chunk arrived; if
the backend then breaks, the client gets one SSE error event and the stream ends.

Timeouts: connect_s for the TCP connect; idle_s for every gap between backend bytes
(including the wait for the first); first_byte_s for the whole time to the first byte.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from kvfleet_router.config import TimeoutsConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.errors import sse_error_event
from kvfleet_router.fault import BUSY, CLIENT, classify

log = logging.getLogger(__name__)

_DROP_REQUEST_HEADERS = frozenset({
    "host", "content-length", "connection", "keep-alive", "transfer-encoding", "te",
    "upgrade", "proxy-authorization", "proxy-connection", "accept-encoding", "expect"})
_KEEP_RESPONSE_HEADERS = ("Content-Type", "Content-Encoding", "X-Request-Id")


class BackendFailure(Exception):
    """The endpoint failed before any byte reached the client."""

    def __init__(self, kind: str, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.kind = kind  # connect | timeout | status | busy | protocol
        self.status = status


@dataclass(slots=True)
class Outcome:
    """What one successful exchange taught us about the endpoint."""

    ttft_s: float
    total_s: float
    num_events: int  # SSE data events seen (output tokens, roughly) on streams
    is_stream: bool
    is_broken: bool = False  # backend broke mid-stream (client got an error event)
    is_client_gone: bool = False
    is_client_fault: bool = False  # a 4xx, or a 5xx the request caused (fault.py): no verdict


def forward_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        if k.lower() not in _DROP_REQUEST_HEADERS:
            out.add(k, v)
    return out


class Forwarder:
    """Owns the one pooled keep-alive ClientSession that every backend call shares
    (forwarding, and the probes, scrapes and KV-event streams that borrow `session`)."""

    def __init__(self, timeouts: TimeoutsConfig) -> None:
        self._session: aiohttp.ClientSession | None = None
        self.set_timeouts(timeouts)

    async def open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30,
                                         ttl_dns_cache=300)
        # No cookies between unrelated clients' requests, and no per-request jar work.
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                              cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Forwarder.open() first (at app startup)"
        return self._session

    def set_timeouts(self, t: TimeoutsConfig) -> None:
        self.first_byte_s = t.first_byte_s
        self.client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s,
                                                    sock_read=t.idle_s)

    async def _open(self, e: EndpointState, path: str, raw: bytes,
                    headers: CIMultiDict[str]) -> tuple[aiohttp.ClientResponse, bytes, bool]:
        """Send, wait for the head and the first chunk: (response, first bytes, is_sse)."""
        resp: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(self.first_byte_s):
                resp = await self.session.post(e.url + path, data=raw, headers=headers,
                                               timeout=self.client_timeout)
                is_sse = resp.content_type == "text/event-stream"
                if resp.status >= 400:  # an error: read it whole, judge whose fault it is
                    body = await resp.read()
                    verdict = classify(resp.status, body)
                    if verdict != CLIENT:  # the endpoint's own fault, or busy: next one
                        kind = "busy" if verdict == BUSY else "status"
                        raise BackendFailure(kind, f"{e.name} answered {resp.status}",
                                             resp.status)
                    return resp, body, False  # the request's own fault: pass it on
                first = await (resp.content.readany() if is_sse else resp.read())
            return resp, first, is_sse
        except BackendFailure:
            if resp is not None:
                resp.release()
            raise
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError,
                aiohttp.ConnectionTimeoutError) as exc:
            if resp is not None:
                resp.close()
            raise BackendFailure("connect", f"{e.name} unreachable: {exc!r}") from None
        except TimeoutError:
            if resp is not None:
                resp.close()
            raise BackendFailure("timeout", f"{e.name} sent no first byte in time",
                                 504) from None
        except (aiohttp.ClientError, OSError) as exc:
            if resp is not None:
                resp.close()
            raise BackendFailure("protocol", f"{e.name} failed: {exc}") from None

    async def forward(self, request: web.Request, e: EndpointState, raw: bytes,
                      on_outcome: Callable[[Outcome], None],
                      headers: CIMultiDict[str] | None = None) -> web.StreamResponse:
        start = time.perf_counter()
        resp, first, is_sse = await self._open(
            e, request.path, raw, headers if headers is not None else
            forward_headers(request.headers))
        ttft = time.perf_counter() - start
        kept = {k: resp.headers[k] for k in _KEEP_RESPONSE_HEADERS if k in resp.headers}
        if not is_sse:
            resp.release()
            on_outcome(Outcome(ttft, ttft, 0, False, is_client_fault=resp.status >= 400))
            return web.Response(status=resp.status, body=first, headers=kept)
        if not first:  # the stream ended before any byte: nothing sent yet, retryable
            resp.close()
            raise BackendFailure("protocol", f"{e.name} closed the stream before any data")
        return await self._stream(request, resp, first, kept, start, ttft, on_outcome)

    async def _stream(self, request: web.Request, resp: aiohttp.ClientResponse, first: bytes,
                      headers: dict[str, str], start: float, ttft: float,
                      on_outcome: Callable[[Outcome], None]) -> web.StreamResponse:
        out = web.StreamResponse(status=resp.status, headers=headers)
        num_events = first.count(b"data:")
        is_broken = is_client_gone = False
        try:
            try:
                await out.prepare(request)
                await out.write(first)
            except (ConnectionError, RuntimeError):
                is_client_gone = True
                return out
            try:
                async for chunk in resp.content.iter_any():
                    num_events += chunk.count(b"data:")
                    try:
                        await out.write(chunk)
                    except (ConnectionError, RuntimeError):
                        is_client_gone = True
                        return out
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                is_broken = True
                log.warning("backend broke mid-stream: %s", exc)
                try:
                    await out.write(sse_error_event(f"backend failed mid-stream: {exc}"))
                except (ConnectionError, RuntimeError):
                    is_client_gone = True
                    return out
            try:
                await out.write_eof()
            except (ConnectionError, RuntimeError):
                is_client_gone = True
            return out
        finally:
            if is_client_gone or is_broken:
                resp.close()  # drop the connection so the engine frees the request
            else:
                resp.release()
            on_outcome(Outcome(ttft, time.perf_counter() - start, num_events, True,
                               is_broken, is_client_gone))

    async def post_json(self, e: EndpointState, path: str, raw: bytes,
                        headers: CIMultiDict[str]) -> tuple[int, bytes]:
        """A non-streaming side call (P/D prefill leg); raises BackendFailure."""
        resp, body, _ = await self._open(e, path, raw, headers)
        resp.release()
        return resp.status, body
