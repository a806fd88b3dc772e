"""A fault-injecting TCP proxy on loopback, between a router and one engine.

The router is given the proxy's address for the engine; the proxy forwards bytes both ways
to the engine's current address (`upstream`, changed when the engine moves) in one of
these modes, switched at run time:

- `pass`: plain forwarding;
- `latency`: every chunk from the engine waits `latency_s` first (a slow network);
- `drop`: every open connection is reset (RST, SO_LINGER 0) and new ones are reset on
  accept (a path that drops connections);
- `truncate`: each connection's answer is cut after `truncate_bytes` bytes and reset (a
  response that stops half-way);
- `garbage_metrics`: a request for `/metrics` is answered by the proxy itself with a 200 of
  garbage (what a broken exporter or a captive HTML page serves); everything else passes.

HTTP/1.1 without pipelining sends a request only after the previous answer ended, so a
`GET /metrics` starts a client chunk on a kept-alive connection too.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

PASS, LATENCY, DROP, TRUNCATE, GARBAGE_METRICS = (
    "pass", "latency", "drop", "truncate", "garbage_metrics")
MODES = (PASS, LATENCY, DROP, TRUNCATE, GARBAGE_METRICS)

GARBAGE_BODY = (
    b"<html><body>502 upstream gone</body></html>\n"
    b"vllm:num_requests_running NaN\nvllm:num_requests_waiting -17\n"
    b"vllm:kv_cache_usage_perc 1e308\n\x00\xff\xfe not a metric {{{\n"
)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST, not FIN: the peer sees a connection reset."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.upstream = upstream
        self.host = host
        self.mode = PASS
        self.latency_s = 0.25
        self.truncate_bytes = 600
        self.num_connections = 0
        self.num_faulted = 0  # connections reset, cut or answered with garbage
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._open):
                writer.transport.abort()
            if self._tasks:  # aborted transports end their reads: let the handlers return
                await asyncio.wait(set(self._tasks), timeout=5.0)
            await self._server.wait_closed()
            self._server = None

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}; known: {', '.join(MODES)}")
        self.mode = mode
        if mode == DROP:
            for writer in list(self._open):
                self.num_faulted += 1
                _reset(writer)

    async def _handle(self, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self.mode == DROP:
            self.num_faulted += 1
            _reset(client_w)
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(client_w)  # the engine is gone: the router sees what it would see
            return
        self._open.update((client_w, up_w))
        try:
            await asyncio.gather(self._to_engine(client_r, client_w, up_w),
                                 self._to_client(up_r, client_w, up_w))
        finally:
            for w in (client_w, up_w):
                self._open.discard(w)
                w.transport.abort()

    async def _to_engine(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                         up_w: asyncio.StreamWriter) -> None:
        try:
            while chunk := await client_r.read(65536):
                if self.mode == GARBAGE_METRICS and chunk.startswith(b"GET /metrics"):
                    self.num_faulted += 1
                    client_w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                   b"Content-Length: %d\r\n\r\n" % len(GARBAGE_BODY)
                                   + GARBAGE_BODY)
                    await client_w.drain()
                    continue
                up_w.write(chunk)
                await up_w.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            up_w.transport.abort()
            client_w.transport.abort()

    async def _to_client(self, up_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                         up_w: asyncio.StreamWriter) -> None:
        num_sent = 0
        try:
            while chunk := await up_r.read(65536):
                if self.mode == LATENCY:
                    await asyncio.sleep(self.latency_s)
                if self.mode == TRUNCATE:
                    room = self.truncate_bytes - num_sent
                    if len(chunk) >= room:
                        client_w.write(chunk[:max(room, 0)])
                        with contextlib.suppress(OSError):
                            await client_w.drain()
                        self.num_faulted += 1
                        _reset(client_w)
                        return
                num_sent += len(chunk)
                client_w.write(chunk)
                await client_w.drain()
        except OSError:
            pass
        finally:
            up_w.transport.abort()
            client_w.transport.abort()
