"""An async load generator for OpenAI-style servers and routers.

Two shapes of load:
- closed loop: C workers each send one request after another for a fixed time; it reports
  latency percentiles (full response, and first byte), req/s and errors by kind;
- open streams: N long SSE streams opened together; it reports errors, the peak number
  of streams open at once and the peak RSS of a process tree (the router) read from /proc.

A streamed response counts as good only if it has status 200 and ends with `data: [DONE]`.

Connections are kept alive and reused by default; `new_session(..., is_new_connection=True)`
opens a new connection for every request instead, as clients spread by an L4 balancer
(a Kubernetes Service) do when each of them sends few requests.

    python -m kvfleet_bench.loadgen --url http://127.0.0.1:8000 --concurrency 64 --duration 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import random
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

from kvfleet_bench import procs
from kvfleet_bench.stats import LoadStats, percentile

DONE_MARK = b"data: [DONE]"
TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", 0)  # Linux only


@dataclass(slots=True)
class RequestResult:
    is_ok: bool
    start_s: float
    latency_s: float
    ttft_s: float
    error: str = ""
    body: bytes = b""  # the whole body when asked to keep it
    local_port: int = 0  # the client side's TCP port, when asked (joins a balancer's log)
    start_wall_s: float = 0.0  # time.time() at the start, with local_port


@dataclass(slots=True)
class ClosedLoopStats(LoadStats):
    concurrency: int
    ttft_p50_ms: float
    ttft_p99_ms: float


@dataclass(slots=True)
class StreamStats:
    num_streams: int
    num_ok: int
    num_errors: int
    errors: dict[str, int]
    peak_open: int
    peak_rss_mb: float
    router_cpu_s: float
    wall_s: float
    latency_p50_ms: float
    latency_p99_ms: float


def completion_body(model: str, max_tokens: int, is_stream: bool, prompt: str) -> bytes:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": is_stream}
    return json.dumps(body).encode()


class _QuickAckHandler(ResponseHandler):
    """Acknowledge every segment at once (TCP_QUICKACK, which the kernel keeps re-arming off).

    A client with delayed ACKs makes a server that writes a response in several small
    segments without TCP_NODELAY wait ~40 ms per response (Nagle's algorithm holds the
    second write until the first is acknowledged). sglang-router 0.3.2 streams that way;
    the openai SDK does not suffer it, so neither should the load generator.
    """

    local_port = 0  # the connection's client-side port (joins a balancer's access log)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sockname = transport.get_extra_info("sockname")
        if sockname:
            self.local_port = int(sockname[1])
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        sock = self.transport.get_extra_info("socket") if self.transport else None
        if sock is not None and TCP_QUICKACK:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
        super().data_received(data)


def new_session(timeout_s: float, is_new_connection: bool = False) -> aiohttp.ClientSession:
    """A client session; with `is_new_connection`, one TCP connection per request (closed
    after the response) instead of keep-alive reuse."""
    connector = (aiohttp.TCPConnector(limit=0, force_close=True) if is_new_connection
                 else aiohttp.TCPConnector(limit=0, keepalive_timeout=60, force_close=False))
    if TCP_QUICKACK or is_new_connection:
        # aiohttp builds each connection's protocol from this factory
        connector._factory = functools.partial(  # type: ignore[assignment]
            _QuickAckHandler, loop=asyncio.get_running_loop()
        )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        headers={"Content-Type": "application/json"},
    )


_DRAINS: set[asyncio.Task] = set()


async def _drain(resp: aiohttp.ClientResponse) -> None:
    try:
        await resp.read()
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass
    finally:
        resp.release()


async def settle_drains() -> None:
    """Wait for the tails of finished streams (see `send`) before closing a session."""
    while _DRAINS:
        await asyncio.gather(*list(_DRAINS))


def _local_port(resp: aiohttp.ClientResponse) -> int:
    # the protocol outlives the connection's release (a small body is read at once)
    return int(getattr(getattr(resp, "_protocol", None), "local_port", 0))


async def send(
    session: aiohttp.ClientSession, url: str, body: bytes, is_stream: bool, keep_body: bool = False,
    is_port_kept: bool = False,
) -> RequestResult:
    """One request. A stream is complete, and timed, at its `data: [DONE]` event, as an SSE
    client acts on it; the bytes after it (the chunked terminator, which some servers hold
    back behind Nagle's algorithm) are read in the background so the connection is reused.
    With `is_port_kept`, the result carries the connection's local port and wall start."""
    start = time.perf_counter()
    start_wall = time.time() if is_port_kept else 0.0
    ttft = math.nan
    try:
        resp = await session.post(url, data=body)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return RequestResult(False, start, time.perf_counter() - start, ttft, type(exc).__name__)
    port = _local_port(resp) if is_port_kept else 0
    result = await _read(resp, start, ttft, is_stream, keep_body)
    result.local_port, result.start_wall_s = port, start_wall
    return result


async def _read(resp: aiohttp.ClientResponse, start: float, ttft: float, is_stream: bool,
                keep_body: bool) -> RequestResult:
    is_handed_off = False
    try:
        parts: list[bytes] = []
        tail = b""
        while chunk := await resp.content.readany():
            if not parts:
                ttft = time.perf_counter() - start
            parts.append(chunk)
            if is_stream and DONE_MARK in tail + chunk:
                break
            tail = chunk[-len(DONE_MARK):]
        latency = time.perf_counter() - start
        whole = b"".join(parts)
        if not resp.content.at_eof():
            task = asyncio.create_task(_drain(resp))
            _DRAINS.add(task)
            task.add_done_callback(_DRAINS.discard)
            is_handed_off = True
        if resp.status != 200:
            return RequestResult(False, start, latency, ttft, f"http {resp.status}", whole)
        if is_stream and DONE_MARK not in whole[-64:]:
            return RequestResult(False, start, latency, ttft, "incomplete stream", whole)
        return RequestResult(True, start, latency, ttft, "", whole if keep_body else b"")
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return RequestResult(False, start, time.perf_counter() - start, ttft, type(exc).__name__)
    finally:
        if not is_handed_off:
            resp.release()


async def closed_loop(
    urls: list[str],
    make_body: Callable[[int], bytes],
    is_stream: bool,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 0.5,
    timeout_s: float = 60.0,
    think_s: float = 0.0,
) -> ClosedLoopStats:
    """C workers, each looping on one request at a time; worker i uses urls[i % len].
    With `think_s`, each worker waits uniform(0, 2 x think_s) before every request."""
    results: list[RequestResult] = []
    t0 = time.perf_counter()
    t_measure, t_end = t0 + warmup_s, t0 + warmup_s + duration_s

    async def worker(i: int, session: aiohttp.ClientSession) -> None:
        url = urls[i % len(urls)]
        n = 0
        rng = random.Random(i)
        while time.perf_counter() < t_end:
            if think_s > 0:
                await asyncio.sleep(rng.uniform(0, 2 * think_s))
            result = await send(session, url, make_body(i * 1_000_003 + n), is_stream)
            n += 1
            if result.start_s >= t_measure:
                results.append(result)

    async with new_session(timeout_s) as session:
        await asyncio.gather(*(worker(i, session) for i in range(concurrency)))
        await settle_drains()
    ok = [r for r in results if r.is_ok]
    bad = Counter(r.error for r in results if not r.is_ok)
    return ClosedLoopStats(
        concurrency=concurrency,
        duration_s=duration_s,
        num_ok=len(ok),
        num_errors=sum(bad.values()),
        errors=dict(bad),
        rps=len(ok) / duration_s,
        p50_ms=percentile([r.latency_s for r in ok], 50) * 1000,
        p99_ms=percentile([r.latency_s for r in ok], 99) * 1000,
        ttft_p50_ms=percentile([r.ttft_s for r in ok], 50) * 1000,
        ttft_p99_ms=percentile([r.ttft_s for r in ok], 99) * 1000,
    )


async def open_streams(
    urls: list[str],
    body: bytes,
    num_streams: int,
    ramp_s: float,
    timeout_s: float,
    router_pid: int | None,
) -> StreamStats:
    """Open `num_streams` streams over `ramp_s` (stream i to urls[i % len]), hold them, and
    watch the router's RSS."""
    num_open = peak_open = 0
    peak_rss = 0
    cpu_before = procs.cpu_seconds(router_pid) if router_pid else 0.0

    async def one(i: int, session: aiohttp.ClientSession) -> RequestResult:
        nonlocal num_open, peak_open
        await asyncio.sleep(ramp_s * i / num_streams)
        num_open += 1
        peak_open = max(peak_open, num_open)
        try:
            return await send(session, urls[i % len(urls)], body, is_stream=True)
        finally:
            num_open -= 1

    async def watch(stop: asyncio.Event) -> None:
        nonlocal peak_rss
        while not stop.is_set():
            if router_pid:
                peak_rss = max(peak_rss, procs.rss_bytes(router_pid))
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except TimeoutError:
                pass

    t0 = time.perf_counter()
    stop = asyncio.Event()
    async with new_session(timeout_s) as session:
        watcher = asyncio.create_task(watch(stop))
        results = await asyncio.gather(*(one(i, session) for i in range(num_streams)))
        await settle_drains()
        stop.set()
        await watcher
    ok = [r for r in results if r.is_ok]
    bad = Counter(r.error for r in results if not r.is_ok)
    return StreamStats(
        num_streams=num_streams,
        num_ok=len(ok),
        num_errors=sum(bad.values()),
        errors=dict(bad),
        peak_open=peak_open,
        peak_rss_mb=peak_rss / 2**20,
        router_cpu_s=(procs.cpu_seconds(router_pid) - cpu_before) if router_pid else 0.0,
        wall_s=time.perf_counter() - t0,
        latency_p50_ms=percentile([r.latency_s for r in ok], 50) * 1000,
        latency_p99_ms=percentile([r.latency_s for r in ok], 99) * 1000,
    )


def install_uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", action="append", required=True, help="base URL; repeat to spread")
    p.add_argument("--model", default="fake-model")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--streams", type=int, default=0, help="open-streams mode: N streams at once")
    p.add_argument("--router-pid", type=int, default=0, help="whose RSS to watch (streams mode)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.concurrency < 1 or args.duration <= 0 or args.max_tokens < 1 or args.streams < 0:
        print("loadgen: concurrency, duration and max-tokens must be positive", file=sys.stderr)
        return 2
    install_uvloop()
    is_stream = not args.no_stream
    targets = [u.rstrip("/") + "/v1/completions" for u in args.url]
    if args.streams:
        body = completion_body(args.model, args.max_tokens, True, "hello")
        result: Any = asyncio.run(
            open_streams(targets, body, args.streams, 1.0, 600.0, args.router_pid or None)
        )
    else:
        result = asyncio.run(
            closed_loop(
                targets,
                lambda n: completion_body(args.model, args.max_tokens, is_stream, f"hello {n}"),
                is_stream,
                args.concurrency,
                args.duration,
            )
        )
    print(json.dumps(asdict(result), indent=1))
    return 0 if result.num_errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
