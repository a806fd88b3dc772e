"""Forward one request to one endpoint and stream the answer back, bytes untouched.

`Forwarder.forward` either returns a response already (being) sent to the client, or raises
`BackendFailure` while nothing has reached the client, so the caller may retry elsewhere.
Non-streaming answers are buffered whole (small), so any failure there is still retryable.
A stream is committed to the client only once the backend's first body chunk arrived; if
the backend then breaks, the client gets one SSE error event and the stream ends, unless
the caller passed a `StreamLedger` (migration.py): then only whole SSE events are
forwarded, and a break (an error, an idle timeout, or an end without `[DONE]`) raises
`StreamBroken` with the response still open, so the caller continues the stream on
another endpoint (dispatch.py).

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
from kvfleet_router.migration import StreamLedger
from kvfleet_router.revisions import MeteredCounts, RevisionMeter
from kvfleet_router.upstream import UpstreamConnectError, UpstreamPool, UpstreamResponse

log = logging.getLogger(__name__)

_DROP_REQUEST_HEADERS = frozenset({
    "host", "content-length", "connection", "keep-alive", "transfer-encoding", "te",
    "upgrade", "proxy-authorization", "proxy-connection", "accept-encoding", "expect"})
_KEEP_RESPONSE_HEADERS = ("Content-Type", "Content-Encoding", "X-Request-Id")


class BackendFailure(Exception):
    """The endpoint failed before any byte reached the client."""

    def __init__(self, kind: str, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.kind = kind  # connect | timeout | status | busy | protocol | refused
        self.status = status


class StreamBroken(Exception):
    """A stream's backend broke after the client got bytes; `out` is still open."""

    def __init__(self, out: web.StreamResponse, ledger: StreamLedger, reason: str) -> None:
        super().__init__(reason)
        self.out = out
        self.ledger = ledger


REFUSED = "refused"  # BackendFailure.kind: the request's own fault (a 4xx), not the endpoint's

# How a relay of backend bytes to the client ended.
DONE, BROKEN, CLIENT_GONE = "done", "broken", "client-gone"
_SSE_DONE = b"data: [DONE]\n\n"


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
    """Owns the backend connections: the forwarding path's own keep-alive pool
    (upstream.py, a lean HTTP/1.1 client) and the one pooled aiohttp ClientSession that
    the probes, scrapes and KV-event streams borrow (`session`)."""

    def __init__(self, timeouts: TimeoutsConfig, meter: RevisionMeter | None = None) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._upstream = UpstreamPool()
        self.meter = meter  # per-revision outcomes and latencies (revisions.py), if kept
        self.set_timeouts(timeouts)

    def counts_of(self, e: EndpointState) -> MeteredCounts | None:
        """Where an attempt on `e` is counted; None when nothing is (no revision)."""
        return self.meter.of(e.revision) if self.meter is not None and e.revision else None

    async def open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30,
                                         ttl_dns_cache=300)
        # No cookies between unrelated clients' requests, and no per-request jar work.
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                              cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def close(self) -> None:
        await self._upstream.close()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Forwarder.open() first (at app startup)"
        return self._session

    def set_timeouts(self, t: TimeoutsConfig) -> None:
        self.first_byte_s = t.first_byte_s
        self.connect_s = t.connect_s
        self.idle_s = t.idle_s  # between any two reads of an answer

    async def _open(self, e: EndpointState, path: str, raw: bytes,
                    headers: CIMultiDict[str], counts: MeteredCounts | None = None,
                    ) -> tuple[UpstreamResponse, bytes, bool]:
        """Send, wait for the head and the first chunk: (response, first bytes, is_sse).
        A failure is counted in `counts` (an error unless a 4xx-like busy answer)."""
        try:
            return await self._open_once(e, path, raw, headers)
        except BackendFailure as exc:
            if counts is not None:
                counts.record(is_error=exc.kind != "busy" or exc.status >= 500)
            raise

    async def _open_once(self, e: EndpointState, path: str, raw: bytes,
                         headers: CIMultiDict[str]) -> tuple[UpstreamResponse, bytes, bool]:
        resp: UpstreamResponse | None = None
        try:
            async with asyncio.timeout(self.first_byte_s):
                resp = await self._upstream.post(e.url, path, raw, headers.items(),
                                                 self.connect_s, self.idle_s)
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
        except (UpstreamConnectError, aiohttp.ServerDisconnectedError) as exc:
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
                      headers: CIMultiDict[str] | None = None,
                      ledger: StreamLedger | None = None,
                      strip_ids: bool = False,
                      on_first_byte: Callable[[], None] | None = None) -> web.StreamResponse:
        """`ledger`: migration is on for this request (see the module's docstring);
        `strip_ids`: the router asked for token ids the client did not; `on_first_byte`:
        told once the backend's first bytes are here. The revision's TTFT: to the first
        chunk of a stream, to the whole answer otherwise."""
        counts = self.counts_of(e)
        start = time.perf_counter()
        resp, first, is_sse = await self._open(
            e, request.path, raw, headers if headers is not None else
            forward_headers(request.headers), counts)
        ttft = time.perf_counter() - start
        if on_first_byte is not None:
            on_first_byte()
        kept = _kept_headers(resp.headers)
        if not is_sse:
            resp.release()
            if counts is not None:
                _counted(counts, resp.status, ttft)
            on_outcome(Outcome(ttft, ttft, 0, False, is_client_fault=resp.status >= 400))
            return web.Response(status=resp.status, body=first, headers=kept)
        if not first:  # the stream ended before any byte: nothing sent yet, retryable
            resp.close()
            if counts is not None:
                counts.record(is_error=True)
            raise BackendFailure("protocol", f"{e.name} closed the stream before any data")
        if counts is not None:
            counts.observe_ttft(ttft)
        out = _SSEResponse(status=resp.status, headers=kept)
        try:
            await out.prepare(request)
            transport = request.transport  # the headers wait for the first bytes (below)
            if transport is None or transport.is_closing():
                raise ConnectionResetError("the client went away")
        except (ConnectionError, RuntimeError):
            resp.close()
            if counts is not None:
                counts.record(is_error=False)  # the client left: no verdict on the engine
            on_outcome(Outcome(ttft, ttft, 0, True, is_client_gone=True))
            return out
        feed = _passthrough if ledger is None else _recording(ledger, strip_ids)
        ending, num_events, reason = CLIENT_GONE, 0, ""  # should the handler be cancelled
        try:
            ending, num_events, reason = await self.relay(out, resp, first, feed, counts)
        finally:
            on_outcome(Outcome(ttft, time.perf_counter() - start, num_events, True,
                               ending == BROKEN, ending == CLIENT_GONE))
        if ending == BROKEN:
            if ledger is not None:
                raise StreamBroken(out, ledger, reason)
            await self.end_broken(out, reason)
        elif ending == DONE:
            await self.end(out)
        return out

    async def relay(self, out: web.StreamResponse, resp: UpstreamResponse, first: bytes,
                    feed: Callable[[bytes], bytes], counts: MeteredCounts | None = None,
                    ) -> tuple[str, int, str]:
        """Backend bytes through `feed` to the client: (how it ended, SSE data events seen,
        why it broke). The backend connection is released, or dropped when the exchange
        did not finish (so the engine frees the request). With a recording `feed`, an end
        without `[DONE]` is a break: a proxy or engine cut the stream short. `counts`:
        the gaps between chunks go to its ITL, and the attempt to its outcomes (a break
        is an error). When the backend's body has ended with a chunk (its terminating
        chunk came in the same read), the client's body ends with it too: one write
        for the last bytes and the end (`out` is then ended here; `end` does nothing)."""
        # The per-chunk loop of every stream: a plain readany() loop (no async generators
        # in between), the feed called only when it records, the ITL clock read only when
        # a revision is metered.
        num_events = 0
        ending, reason = DONE, ""
        is_recording = feed is not _passthrough
        is_done = False  # the last bytes sent ended with [DONE] (a recording feed's check)
        itl = counts.observe_itl if counts is not None else None
        last = 0.0  # when the previous chunk arrived (0: this is the first)
        content = resp.content
        read = content.readany
        write = out.write
        data = first
        is_first = True
        try:
            while True:
                if data:
                    if itl is not None:
                        now = time.perf_counter()
                        if last:
                            itl(now - last)
                        last = now
                    num_events += data.count(b"data:")
                    sent = feed(data) if is_recording else data
                    if sent:
                        is_done = sent.endswith(_SSE_DONE)
                    try:
                        if content.at_eof() and (is_done or not is_recording):
                            await out.write_eof(sent)  # the last bytes and the end, one write
                            return ending, num_events, reason
                        if sent or is_first:  # (b"" sends the headers that wait for bytes)
                            await write(sent)
                    except (ConnectionError, RuntimeError):
                        ending = CLIENT_GONE
                        return ending, num_events, reason
                    is_first = False
                data = await read()
                if not data:  # b"": the backend's body ended
                    break
            if is_recording and not is_done:
                ending, reason = BROKEN, "the stream ended without [DONE]"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ending, reason = BROKEN, str(exc) or type(exc).__name__
            log.warning("backend broke mid-stream: %s", reason)
        finally:
            if ending == DONE:
                resp.release()
            else:
                resp.close()
            if counts is not None:
                counts.record(is_error=ending == BROKEN)
        return ending, num_events, reason

    @staticmethod
    async def end_broken(out: web.StreamResponse, reason: str) -> None:
        """The client's stream ends with one error event (the openai client raises it)."""
        try:
            await out.write(sse_error_event(f"backend failed mid-stream: {reason}"))
        except (ConnectionError, RuntimeError):
            return
        await Forwarder.end(out)

    @staticmethod
    async def end(out: web.StreamResponse) -> None:
        try:
            await out.write_eof()
        except (ConnectionError, RuntimeError):
            pass

    async def open_stream(self, e: EndpointState, path: str, raw: bytes,
                          headers: CIMultiDict[str]) -> tuple[UpstreamResponse, bytes]:
        """A continuation leg (dispatch.py): the response and its first bytes, which must
        be a stream; anything else raises BackendFailure (the next endpoint is tried).
        Its revision's TTFT is observed here, its outcome by `relay`."""
        counts = self.counts_of(e)
        start = time.perf_counter()
        resp, first, is_sse = await self._open(e, path, raw, headers, counts)
        if resp.status >= 400 or not is_sse or not first:
            resp.close()
            if counts is not None:  # a 4xx refusal is the request's fault, not the engine's
                counts.record(is_error=resp.status >= 500 or resp.status < 400)
            # A 4xx here is the request's own fault (_open passes only those on): the
            # continuation itself was refused, which no other endpoint would take either.
            raise BackendFailure(REFUSED if resp.status >= 400 else "protocol",
                                 f"{e.name} answered the continuation with {resp.status}"
                                 f"{'' if is_sse else ' (not a stream)'}: {first[:200]!r}",
                                 resp.status)
        if counts is not None:
            counts.observe_ttft(time.perf_counter() - start)
        return resp, first

    async def post_json(self, e: EndpointState, path: str, raw: bytes,
                        headers: CIMultiDict[str]) -> tuple[int, bytes]:
        """A non-streaming side call (P/D prefill leg); raises BackendFailure. Counted
        for its revision (outcome only: a prefill leg's latency is not a TTFT)."""
        counts = self.counts_of(e)
        resp, body, _ = await self._open(e, path, raw, headers, counts)
        resp.release()
        if counts is not None:
            counts.record(is_error=resp.status >= 500)
        return resp.status, body


def _counted(counts: MeteredCounts, status: int, ttft: float) -> None:
    """A whole (not streamed) answer: an error if 5xx; its latency is the TTFT if 2xx/3xx."""
    counts.record(is_error=status >= 500)
    if status < 400:
        counts.observe_ttft(ttft)


class _SSEResponse(web.StreamResponse):
    """A relayed stream's response: its headers go out with its first bytes, in one write
    (aiohttp's buffered headers, as web.Response has them), not in a write of their own;
    `forward` prepares it only once the backend's first bytes are here."""

    _send_headers_immediately = False


def _kept_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The backend's response headers the client gets (one lookup each)."""
    kept = {}
    for name in _KEEP_RESPONSE_HEADERS:
        value = headers.get(name)
        if value is not None:
            kept[name] = value
    return kept


def _passthrough(data: bytes) -> bytes:
    return data


def _recording(ledger: StreamLedger, strip_ids: bool) -> Callable[[bytes], bytes]:
    """Whole events only, recorded in the ledger (and the ids the client did not ask for
    taken out after recording, so a continuation can still use them)."""
    return ledger.feed_stripped if strip_ids else ledger.feed
