"""One engine replica's process life: start the engine thread, serve, drain on SIGTERM.

SIGTERM (or SIGINT) starts a drain: new requests get 503 and /health says draining,
in-flight requests run to completion for up to the drain timeout, then the process
exits 0. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from typing import Any

import aiohttp
from aiohttp import web

from kvfleet_engine.contract import ENGINE_TOKEN_ENV
from kvfleet_engine.core.kv_transfer import HandleStore
from kvfleet_engine.server import pd
from kvfleet_engine.server.app import build_app
from kvfleet_engine.server.engine_thread import EngineThread
from kvfleet_engine.server.http_protocol import JSONErrorRunner
from kvfleet_engine.server.kv_events import KVEventHub
from kvfleet_engine.server.metrics import ServerMetrics
from kvfleet_engine.server.state import ServerSettings, ServerState

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05


def serve(engine: Any, tokenizer: Any, settings: ServerSettings) -> int:
    try:
        import uvloop
    except ImportError:  # optional: plain asyncio works, a little slower
        return asyncio.run(serve_async(engine, tokenizer, settings))
    return uvloop.run(serve_async(engine, tokenizer, settings))


async def serve_async(engine: Any, tokenizer: Any, settings: ServerSettings) -> int:
    loop = asyncio.get_running_loop()
    state = ServerState(settings, tokenizer)
    state.kv_events = KVEventHub()
    state.handles = HandleStore(settings.kv_handle_ttl_s)
    state.engine = EngineThread(engine, loop, on_outputs=state.deliver_outputs,
                                on_error=state.deliver_error,
                                on_kv_events=state.kv_events.publish)
    state.kv_block_shape = engine.runner.kv_block_shape()  # before the thread owns the engine
    state.peer_session = aiohttp.ClientSession()
    stats = state.engine.stats
    state.metrics = ServerMetrics(settings.served_model_names[0], settings.role,
                                  block_size=stats.block_size, num_gpu_blocks=stats.num_gpu_blocks,
                                  read_stats=lambda: state.engine.stats)
    warn_if_open_kv_events(settings)
    state.engine.start()  # before listening, so /health never sees a stopped engine
    runner = JSONErrorRunner(build_app(state), handler_cancellation=True, access_log=None,
                             shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError:
        state.engine.stop()
        await runner.cleanup()
        await state.peer_session.close()
        raise
    settings.port = _bound_port(runner, settings.port)
    stop = asyncio.Event()
    drain_task: list[asyncio.Task[None]] = []

    def on_signal(signum: int) -> None:
        if state.drain.begin(time.monotonic()):
            log.warning("signal %d: draining (timeout %.1fs)", signum, settings.drain_timeout_s)
            state.metrics.set_draining(True)
            drain_task.append(loop.create_task(_wait_drained(state, stop)))
        else:
            log.warning("second signal %d: stopping now", signum)
            stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    sweeper = loop.create_task(pd.sweep_expired_handles(state))
    watchdog = loop.create_task(_watch_engine(state, stop))
    print(f"kvfleet engine ({settings.role}) serving {settings.served_model_names[0]} on "
          f"http://{settings.host}:{settings.port}", flush=True)
    try:
        await stop.wait()
    finally:
        sweeper.cancel()
        watchdog.cancel()
        state.kv_events.close()
        await runner.cleanup()  # cancels handlers still running (drain timed out)
        await state.peer_session.close()
        for held in state.handles.pop_all():
            log.info("dropping unclaimed KV handle of %s", held.request_id)
        state.engine.stop()
    if state.is_engine_crashed:
        print("kvfleet engine: the engine thread crashed; see the log above", file=sys.stderr)
        return 1
    print("kvfleet engine stopped", file=sys.stderr, flush=True)
    return 0


LOOPBACK_HOSTS = ("localhost", "::1")


def warn_if_open_kv_events(settings: ServerSettings) -> bool:
    """Warn (and say True) when a replica reachable beyond this machine has no token:
    then anyone who can reach it reads its KV events and KV blocks (prompt token ids)."""
    is_loopback = settings.host in LOOPBACK_HOSTS or settings.host.startswith("127.")
    if settings.internal_token or is_loopback:
        return False
    log.warning("listening on %s without %s: /v1/kv_events, /v1/kv_transfer and "
                "/v1/kv_cache/export (prompt token ids, KV) are open to anyone who can reach "
                "this port; set the token for every replica and router of the fleet",
                settings.host, ENGINE_TOKEN_ENV)
    return True


async def _wait_drained(state: ServerState, stop: asyncio.Event) -> None:
    while not state.drain.can_stop(time.monotonic(), state.num_in_flight):
        await asyncio.sleep(DRAIN_POLL_S)
    stop.set()


async def _watch_engine(state: ServerState, stop: asyncio.Event, period_s: float = 0.5) -> None:
    """A crashed engine thread ends the process (non-zero), so a supervisor restarts it."""
    while state.engine.is_alive:
        await asyncio.sleep(period_s)
    log.error("engine thread is gone; stopping the server")
    state.is_engine_crashed = True
    stop.set()


def _bound_port(runner: web.AppRunner, requested: int) -> int:
    """The real port when 0 was asked for (tests let the OS pick a free one)."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return requested
