"""The forwarding path's HTTP/1.1 client: one POST to an endpoint over a pooled keep-alive
connection, its answer read as it arrives (proxy.py's `Forwarder` is its one user).

aiohttp's ClientSession costs about as much CPU per request as the rest of the router's
own work together (a request object, a timer context, a task for the body, a parser and a
StreamReader per answer); the forwarding path needs only a small part of it: a POST of
bytes that are already whole, and an answer read as it comes (whole, or chunk by chunk
for a stream). Probes, scrapes, KV events, /v1/models and the state exchange keep using
aiohttp's session.

What it does, as aiohttp's client did for the router: keep-alive connections pooled per
origin (LIFO; one idle longer than `KEEPALIVE_S`, or closed by the peer, is dropped); TCP
connect within `connect_s` (refused or unreachable: `UpstreamConnectError`); `idle_s`
between any two reads once the request is sent (`aiohttp.ServerTimeoutError`, a
TimeoutError); framing by Content-Length, chunked transfer coding or the connection's
end; bodies passed through as sent (no decompression); reading paused while more than
`HIGH_WATER` bytes wait for the caller, so a slow client slows its backend, not the
router's memory. A connection is reused only after its answer was read whole
(`release`); `close` drops it (the engine sees the request go away). The request carries
what aiohttp added by default (Accept, Accept-Encoding, User-Agent, a Content-Type when
the client sent none), so engines see the same headers as before.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Iterable
from urllib.parse import urlsplit

import aiohttp
from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict, CIMultiDictProxy

KEEPALIVE_S = 30.0  # an idle pooled connection older than this is not reused
HIGH_WATER = 256 * 1024  # bytes waiting for the caller before reading pauses
MAX_HEAD_BYTES = 64 * 1024  # a longer status line + headers is a protocol error
_DEFAULT_HEADERS = (("Accept", "*/*"), ("Accept-Encoding", "gzip, deflate"),
                    ("User-Agent", SERVER_SOFTWARE))


class UpstreamConnectError(aiohttp.ClientConnectionError):
    """No connection to the endpoint (refused, unreachable, unresolvable, or no answer to
    the connect within `connect_s`)."""


class UpstreamProtocolError(aiohttp.ClientPayloadError):
    """The endpoint's answer is not HTTP/1.1 as framed (a bad status line, header or
    chunk size, or a head too long)."""


_IDLE_TIMEOUT = "Timeout on reading data from socket"  # aiohttp's words for sock_read


class Origin:
    """Where an endpoint URL's requests go: (scheme, host, port), the Host header and the
    path prefix its URL may carry."""

    __slots__ = ("host", "port", "ssl", "host_header", "prefix", "key")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.ssl = parts.scheme == "https"
        self.host = parts.hostname
        default = 443 if self.ssl else 80
        self.port = parts.port or default
        name = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = name if self.port == default else f"{name}:{self.port}"
        self.prefix = parts.path.rstrip("/")
        self.key = (parts.scheme, self.host, self.port)


class _Conn(asyncio.Protocol):
    """One connection and the answer being read on it (one request at a time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.is_lost = False
        self.exc: BaseException | None = None
        self._buf = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._idle_s = 0.0
        self._last_read = 0.0
        self._paused = False
        self.resp: UpstreamResponse | None = None

    # --- asyncio.Protocol ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_lost = True
        resp = self.resp
        if resp is not None and not resp.is_done and self.exc is None:
            if resp.status == 0:
                self.exc = aiohttp.ServerDisconnectedError()
            elif resp.framing == "close":
                resp.finish()  # a close-delimited body ends with the connection
            else:
                self.exc = aiohttp.ClientPayloadError(
                    "Response payload is not completed: the connection closed")
        self._wake()

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        resp = self.resp
        if resp is None:  # bytes nobody asked for: the connection cannot be reused
            self.is_lost = True
            if self.transport is not None:
                self.transport.close()
            return
        if self._buf:
            self._buf += data
        else:
            self._buf = bytearray(data)
        try:
            resp.parse(self._buf)
        except UpstreamProtocolError as exc:
            self.exc = exc
            if self.transport is not None:
                self.transport.close()
        if resp.num_waiting > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost ends a close-delimited body

    # --- waiting ---
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def resume(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    async def wait(self) -> None:
        """Until the next bytes (or the end, or an error); `idle_s` at most since the
        last read. The timer is armed once and re-armed only when it fires early (cheaper
        than moving it on every read)."""
        if self.exc is not None:
            raise self.exc
        if self.is_lost:
            raise aiohttp.ServerDisconnectedError()
        self.resume()
        waiter = self._waiter = self.loop.create_future()
        if self._timer is None:
            self._timer = self.loop.call_at(self._last_read + self._idle_s, self._on_timer)
        await waiter
        if self.exc is not None:
            raise self.exc

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        due = self._last_read + self._idle_s
        if self.loop.time() >= due:
            self._waiter = None
            self.exc = aiohttp.ServerTimeoutError(_IDLE_TIMEOUT)
            waiter.set_result(None)
        else:
            self._timer = self.loop.call_at(due, self._on_timer)

    def start(self, resp: UpstreamResponse, idle_s: float) -> None:
        self.resp = resp
        self.exc = None
        self._idle_s = idle_s
        self._last_read = self.loop.time()

    def close(self) -> None:
        self.is_lost = True
        self.resp = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """An endpoint's answer: status and headers, then the body as it arrives. The parts
    of aiohttp's ClientResponse the forwarder reads (`content` is the response itself)."""

    def __init__(self, pool: UpstreamPool, origin: Origin, conn: _Conn) -> None:
        self._pool = pool
        self._origin = origin
        self._conn: _Conn | None = conn
        self.status = 0
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
        self.framing = ""  # length | chunked | close | none
        self.is_done = False
        self.is_reusable = True
        self.num_waiting = 0  # body bytes parsed, not yet read
        self._chunks: collections.deque[bytes] = collections.deque()
        self._remaining = 0  # of the current chunk or the Content-Length body
        self._state = "head"  # head | body | size | data | crlf | trailer | end
        self.content = self

    # --- parsing (called by the connection with its buffer) ---
    def parse(self, buf: bytearray) -> None:
        if self._state == "head" and not self._parse_head(buf):
            return
        state = self._state
        while buf:
            if state in ("body", "data"):
                n = len(buf)
                if n <= self._remaining:  # the usual case: all of it is this body's
                    self._add(bytes(buf))
                    buf.clear()
                    self._remaining -= n
                else:
                    self._add(bytes(buf[:self._remaining]))
                    del buf[:self._remaining]
                    self._remaining = 0
                if self._remaining == 0:
                    if state == "body":
                        self.finish()
                        state = "end"
                    else:
                        state = "crlf"
            elif state == "crlf":
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise UpstreamProtocolError("a chunk does not end with CRLF")
                del buf[:2]
                state = "size"
            elif state == "size":
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise UpstreamProtocolError("a chunk size line is too long")
                    break
                line = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[:end + 2]
                try:
                    size = int(line, 16)
                except ValueError:
                    raise UpstreamProtocolError(f"bad chunk size {line[:40]!r}") from None
                if size < 0:
                    raise UpstreamProtocolError("negative chunk size")
                if size:
                    self._remaining, state = size, "data"
                else:
                    state = "trailer"
            elif state == "trailer":
                end = buf.find(b"\r\n")
                if end < 0:
                    break
                is_last = end == 0
                del buf[:end + 2]
                if is_last:
                    self.finish()
                    state = "end"
            else:  # bytes past the end of the answer: the connection is not reusable
                self.is_reusable = False
                buf.clear()
        self._state = state

    def _parse_head(self, buf: bytearray) -> bool:
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise UpstreamProtocolError("the response head is too long")
                return False
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            del buf[:end + 4]
            version, _, rest = lines[0].partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/1.") or not code.isdigit():
                raise UpstreamProtocolError(f"bad status line {lines[0][:80]!r}")
            status = int(code)
            if 100 <= status < 200 and status != 101:
                continue  # an interim answer (100 Continue): the real one follows
            headers: CIMultiDict[str] = CIMultiDict()
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep or not name or name != name.strip():
                    raise UpstreamProtocolError(f"bad header line {line[:80]!r}")
                headers.add(name, value.strip())
            break
        self.status = status
        self.headers = CIMultiDictProxy(headers)
        connection = headers.get("Connection", "").lower()
        if version == "HTTP/1.0" and connection != "keep-alive" or connection == "close":
            self.is_reusable = False
        if status in (204, 304):
            self.framing, self._state = "none", "end"
            self.finish()
        elif "chunked" in headers.get("Transfer-Encoding", "").lower():
            self.framing, self._state = "chunked", "size"
        elif "Content-Length" in headers:
            try:
                length = int(headers["Content-Length"])
            except ValueError:
                raise UpstreamProtocolError("bad Content-Length") from None
            if length < 0:
                raise UpstreamProtocolError("bad Content-Length")
            self.framing, self._state, self._remaining = "length", "body", length
            if length == 0:
                self._state = "end"
                self.finish()
        else:
            self.framing, self._state = "close", "body"
            self._remaining = 1 << 62
            self.is_reusable = False
        return True

    def _add(self, data: bytes) -> None:
        self._chunks.append(data)
        self.num_waiting += len(data)

    def finish(self) -> None:
        self.is_done = True

    # --- what the forwarder reads ---
    @property
    def content_type(self) -> str:
        raw = self.headers.get("Content-Type", "application/octet-stream")
        return raw.split(";", 1)[0].strip().lower()

    async def head(self) -> None:
        conn = self._conn
        assert conn is not None
        while self.status == 0:
            await conn.wait()

    async def readany(self) -> bytes:
        """What arrived since the last read (waiting for some); b"" at the end."""
        chunks = self._chunks
        while not chunks:
            if self.is_done:
                return b""
            conn = self._conn
            if conn is None:
                raise aiohttp.ClientConnectionError("Connection closed")
            await conn.wait()
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.num_waiting = 0
        return data

    def at_eof(self) -> bool:
        return self.is_done and not self._chunks

    async def read(self) -> bytes:
        """The whole body."""
        parts: list[bytes] = []
        while True:
            data = await self.readany()
            if not data:
                return b"".join(parts)
            parts.append(data)

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool if the answer was
        read whole, else it is closed."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.is_done and self.is_reusable and not conn.is_lost and not conn._buf:
            self._pool.put(self._origin, conn)
        else:
            conn.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class UpstreamPool:
    """Keep-alive connections per origin, and the POST that uses them."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._origins: dict[str, Origin] = {}
        self._ssl: ssl.SSLContext | None = None
        self._swept_at = 0.0
        self.is_closed = False

    def origin(self, url: str) -> Origin:
        got = self._origins.get(url)
        if got is None:
            if len(self._origins) > 4096:  # endpoints come and go with config pushes
                self._origins.clear()
            got = self._origins[url] = Origin(url)
        return got

    def put(self, origin: Origin, conn: _Conn) -> None:
        if self.is_closed:
            conn.close()
            return
        conn.resp = None
        now = conn.idle_since = conn.loop.time()
        self._idle.setdefault(origin.key, []).append(conn)
        if now - self._swept_at > KEEPALIVE_S:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Close the idle connections past `KEEPALIVE_S` everywhere (also those to
        endpoints no request goes to any more)."""
        self._swept_at = now
        for key, idle in list(self._idle.items()):
            kept = [c for c in idle if not c.is_lost and now - c.idle_since < KEEPALIVE_S]
            for conn in idle:
                if conn not in kept:
                    conn.close()
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]

    def _take(self, origin: Origin, now: float) -> _Conn | None:
        idle = self._idle.get(origin.key)
        while idle:
            conn = idle.pop()
            if not conn.is_lost and now - conn.idle_since < KEEPALIVE_S:
                return conn
            conn.close()
        return None

    async def _connect(self, origin: Origin, connect_s: float) -> _Conn:
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if origin.ssl:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    lambda: _Conn(loop), origin.host, origin.port, ssl=context)
        except TimeoutError:
            raise UpstreamConnectError(
                f"Connection timeout to host {origin.host_header}") from None
        except OSError as exc:
            raise UpstreamConnectError(
                f"Cannot connect to host {origin.host_header} [{exc.strerror or exc}]") from None
        return conn

    async def post(self, url: str, path: str, body: bytes, headers: Iterable[tuple[str, str]],
                   connect_s: float, idle_s: float) -> UpstreamResponse:
        """Send the request and wait for the answer's status and headers."""
        if self.is_closed:
            raise RuntimeError("Session is closed")
        origin = self.origin(url)
        loop = asyncio.get_running_loop()
        conn = self._take(origin, loop.time())
        if conn is None:
            conn = await self._connect(origin, connect_s)
        resp = UpstreamResponse(self, origin, conn)
        conn.start(resp, idle_s)
        head = _request_head(origin, path, len(body), headers)
        transport = conn.transport
        if transport is None or transport.is_closing():
            conn.close()
            raise aiohttp.ServerDisconnectedError()
        transport.writelines((head, body))
        try:
            await resp.head()
        except BaseException:
            resp.close()
            raise
        return resp

    async def close(self) -> None:
        self.is_closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _request_head(origin: Origin, path: str, length: int,
                  headers: Iterable[tuple[str, str]]) -> bytes:
    lines = [f"POST {origin.prefix}{path} HTTP/1.1", f"Host: {origin.host_header}"]
    seen = set()
    for name, value in headers:
        lower = name.lower()
        if lower in ("host", "content-length", "transfer-encoding", "connection"):
            continue
        seen.add(lower)
        lines.append(f"{name}: {value}")
    for name, value in _DEFAULT_HEADERS:
        if name.lower() not in seen:
            lines.append(f"{name}: {value}")
    if "content-type" not in seen:
        lines.append("Content-Type: application/octet-stream")
    lines.append(f"Content-Length: {length}")
    # Header values come from aiohttp's server parser (no CR, LF or NUL in them), decoded
    # with surrogateescape: encoded back so, they leave as the client sent them.
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
