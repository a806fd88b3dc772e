"""The router's answer to HTTP that never reaches a handler, and its serving loop.

aiohttp's protocol answers a request line or header over 8 KB, a malformed chunked body
or TLS spoken to the HTTP port by itself: plain text, plus a traceback at ERROR per
connection, so any unauthenticated client could fill the log. Here those get OpenAI's
error shape (`errors.error_body`), the connection closes, and the log gets one DEBUG line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Callable

from aiohttp import web, web_protocol, web_server

from kvfleet_router.errors import error_body

log = logging.getLogger(__name__)


class _Protocol(web_protocol.RequestHandler):
    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # raised past every middleware: ours, unless the client just went away
        is_bug = status >= 500 and not isinstance(exc, ConnectionError)
        log.log(logging.ERROR if is_bug else logging.DEBUG, "HTTP error from %s: %s",
                request.remote, message or exc, exc_info=exc if is_bug else None)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        text = "internal router error" if is_bug else f"bad HTTP request: {message or ''}"[:200]
        resp = web.Response(status=status, content_type="application/json",
                            text=json.dumps(error_body(text, status, code="bad_http")))
        resp.force_close()
        return resp


class _Server(web_server.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return _Protocol(self, loop=self._loop, **self._kwargs)


async def serve(webapp: web.Application, host: str, port: int,
                on_listening: Callable[[], None] = lambda: None, *,
                reuse_port: bool = False,
                private: tuple[str, int] | None = None,
                stop_delay_s: float = 0.0,
                on_stop: Callable[[], None] = lambda: None) -> None:
    """Listen until SIGINT/SIGTERM, then shut down (in-flight requests get 30 s).
    `on_listening` runs once the sockets accept connections. `reuse_port`: share host:port
    with the pod's other workers (SO_REUSEPORT: the kernel spreads new connections over
    them; workers.py). `private`: a second address serving the same app (a worker's
    loopback port, where its siblings reach it), opened after the public one. On the first
    stop signal `on_stop` runs (health turns 503) and the process keeps serving for
    `stop_delay_s` before it closes its ports, so a balancer that health-checks takes it out
    first and no connection lands on a closed port (Kubernetes' preStop sleep does this for
    pods)."""
    runner = web.AppRunner(webapp, access_log=None, shutdown_timeout=30)
    await runner.setup()
    assert runner.server is not None
    runner.server.__class__ = _Server  # the same server; its connections speak _Protocol
    try:
        # bursts of thousands of clients connect at once
        await web.TCPSite(runner, host, port, backlog=4096,
                          reuse_port=reuse_port or None).start()
        if private is not None:
            await web.TCPSite(runner, private[0], private[1], backlog=4096).start()
        on_listening()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        # a second signal (Ctrl-C reaches the workers and their supervisor forwards it too)
        # must not kill the drain, nor the exit after it, once the loop's handlers are gone
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
            signal.signal(signum, signal.SIG_IGN)
        on_stop()
        if stop_delay_s > 0:
            await asyncio.sleep(stop_delay_s)
    finally:
        await runner.cleanup()
