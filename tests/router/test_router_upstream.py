"""The forwarding path's HTTP/1.1 client (upstream.py) against scripted raw servers:
framing (chunked with awkward splits and trailers, Content-Length, close-delimited, no
body), keep-alive reuse only after a whole answer, the request head engines see, the
idle timeout between reads, refused connects, a server gone before its head, a malformed
chunk, and reading paused while a slow reader has a backlog."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from kvfleet_router.upstream import (
    HIGH_WATER,
    UpstreamConnectError,
    UpstreamPool,
    UpstreamProtocolError,
)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


class RawServer:
    """Runs `script` for each request; counts connections; keeps each request head."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.num_connections = 0
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.heads.append(head)
                await self.script(reader, writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the test ended with the connection open
        finally:
            writer.close()


async def post(pool: UpstreamPool, server: RawServer, idle_s: float = 5.0,
               headers: list[tuple[str, str]] | None = None):  # type: ignore[no-untyped-def]
    return await pool.post(server.url, "/v1/completions", b'{"prompt": "x"}',
                           headers or [("Content-Type", "application/json")], 1.0, idle_s)


async def test_chunked_answers_split_anywhere_arrive_whole_and_the_connection_is_reused():
    body = b"".join(b"data: %d\n\n" % i for i in range(20)) + b"data: [DONE]\n\n"
    wire = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p)
                    for p in (body[:7], body[7:100], body[100:])) + b"0\r\nTrailer: x\r\n\r\n"

    async def dribble(reader, writer):  # type: ignore[no-untyped-def]
        data = OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + wire
        for i in range(0, len(data), 3):  # every boundary split, CRLFs and sizes too
            writer.write(data[i:i + 3])
            await writer.drain()
            await asyncio.sleep(0)

    async with RawServer(dribble) as server:
        pool = UpstreamPool()
        for _ in range(3):
            resp = await post(pool, server)
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            assert await resp.read() == body and resp.at_eof()
            resp.release()
        assert server.num_connections == 1  # kept alive: one connection for three answers
        await pool.close()


@pytest.mark.parametrize("framing", ["length", "close", "none"])
async def test_length_close_delimited_and_empty_bodies(framing):
    async def answer(reader, writer):  # type: ignore[no-untyped-def]
        if framing == "length":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        elif framing == "close":
            writer.write(b"HTTP/1.1 200 OK\r\n\r\nhello, until the end")
            writer.close()
        else:
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")

    async with RawServer(answer) as server:
        pool = UpstreamPool()
        for _ in range(2):
            resp = await post(pool, server)
            want = {"length": b"hello", "close": b"hello, until the end", "none": b""}[framing]
            assert await resp.read() == want
            assert resp.content_type == "application/octet-stream"
            resp.release()
        # reused unless the body ran to the connection's end
        assert server.num_connections == (2 if framing == "close" else 1)
        await pool.close()


async def test_an_answer_not_read_whole_is_not_reused_and_the_head_is_aiohttps():
    async def answer(reader, writer):  # type: ignore[no-untyped-def]
        writer.write(OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()  # and never the last chunk

    async with RawServer(answer) as server:
        pool = UpstreamPool()
        resp = await post(pool, server, headers=[("X-Test", "1")])
        assert await resp.readany() == b"hello" and not resp.at_eof()
        resp.release()  # mid-body: closed, not pooled
        resp = await post(pool, server)
        resp.close()
        assert server.num_connections == 2
        head = server.heads[0].decode()
        port = server.url.rsplit(":", 1)[1]
        assert head.startswith(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n")
        for line in ("X-Test: 1", "Accept: */*", "Accept-Encoding: gzip, deflate",
                     "Content-Type: application/octet-stream", "Content-Length: 15"):
            assert f"\r\n{line}\r\n" in head
        assert "User-Agent: Python/" in head
        await pool.close()


async def test_no_bytes_for_idle_s_is_a_timeout_between_reads():
    async def stall(reader, writer):  # type: ignore[no-untyped-def]
        writer.write(OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.15)
        writer.write(b"3\r\nabc\r\n")  # a gap under idle_s: fine
        await writer.drain()
        await asyncio.sleep(5)  # then a hang

    async with RawServer(stall) as server:
        pool = UpstreamPool()
        resp = await post(pool, server, idle_s=0.4)
        assert await resp.readany() == b"hello"
        assert await resp.readany() == b"abc"
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(aiohttp.ServerTimeoutError, match="Timeout on reading data"):
            await resp.readany()
        assert 0.35 <= asyncio.get_running_loop().time() - t0 < 2.0
        resp.close()
        await pool.close()


async def test_refused_gone_and_malformed():
    pool = UpstreamPool()
    async with RawServer(lambda r, w: asyncio.sleep(0)) as server:
        url = server.url
    with pytest.raises(UpstreamConnectError):  # nobody listens there any more
        await pool.post(url, "/", b"{}", [], 1.0, 1.0)

    async def hang_up(reader, writer):  # type: ignore[no-untyped-def]
        writer.close()

    async with RawServer(hang_up) as server:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await post(pool, server)

    async def bad_chunk(reader, writer):  # type: ignore[no-untyped-def]
        writer.write(OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n")

    async with RawServer(bad_chunk) as server:
        with pytest.raises(UpstreamProtocolError):  # at the head's wait, or at the read
            resp = await post(pool, server)
            await resp.read()
    await pool.close()


async def test_a_slow_reader_pauses_reading_and_gets_everything():
    size = 4 * HIGH_WATER

    async def flood(reader, writer):  # type: ignore[no-untyped-def]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()

    async with RawServer(flood) as server:
        pool = UpstreamPool()
        resp = await post(pool, server)
        conn = resp._conn
        for _ in range(200):  # the backlog grows to the high-water mark, then reading stops
            await asyncio.sleep(0.01)
            if not conn.transport.is_reading():
                break
        assert not conn.transport.is_reading()
        assert resp.num_waiting <= HIGH_WATER + 2 * 65536
        assert len(await resp.read()) == size
        resp.release()
        await pool.close()


async def test_idle_connections_past_keepalive_are_closed_by_the_next_release(monkeypatch):
    import kvfleet_router.upstream as upstream

    async def answer(reader, writer):  # type: ignore[no-untyped-def]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async with RawServer(answer) as old_server, RawServer(answer) as server:
        pool = UpstreamPool()
        resp = await post(pool, old_server)
        await resp.read()
        resp.release()  # pooled; then no request goes there any more
        [stale] = pool._idle[("http", "127.0.0.1", int(old_server.url.rsplit(":", 1)[1]))]
        monkeypatch.setattr(upstream, "KEEPALIVE_S", 0.05)
        await asyncio.sleep(0.1)
        resp = await post(pool, server)
        await resp.read()
        resp.release()  # a release sweeps: the stale one is closed
        assert stale.is_lost and stale.transport.is_closing()
        assert len(pool._idle) == 1
        await pool.close()
