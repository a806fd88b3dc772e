"""Errors aiohttp answers before any handler runs, in OpenAI's shape and logged quietly.

A request line or header over 8 KB, a malformed chunked body, TLS or other garbage spoken
to the HTTP port: aiohttp's protocol answers these itself, as plain text, and logs each
with a traceback at ERROR, so any client could fill the log. `JSONErrorRunner` is an
`AppRunner` whose connections answer with `{"error": {...}}` (then close) and log one
DEBUG line; only a 5xx (a bug that escaped every handler) is still logged at ERROR.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web, web_protocol, web_server

from kvfleet_engine.server.errors import error_body, type_for_status

log = logging.getLogger(__name__)


class _JSONErrorProtocol(web_protocol.RequestHandler):
    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500 and not isinstance(exc, ConnectionError):  # a bug of ours
            log.error("error serving %s", request.remote, exc_info=exc)
        else:  # bad HTTP, or a client that went away while we answered
            log.debug("bad HTTP from %s: %s", request.remote, message or exc)
        if request.writer.output_size > 0:  # a response is under way: nothing to add
            raise ConnectionError("response already started")
        reason = (message or "")[:160] if status < 500 else "the request could not be served"
        body = error_body(f"bad HTTP request: {reason}" if status < 500 else reason,
                          type_for_status(status), code="bad_http")
        resp = web.Response(status=status, text=json.dumps(body),
                            content_type="application/json")
        resp.force_close()
        return resp


class _JSONErrorServer(web_server.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return _JSONErrorProtocol(self, loop=self._loop, **self._kwargs)


class JSONErrorRunner(web.AppRunner):
    async def _make_server(self) -> web_server.Server:
        server = await super()._make_server()
        server.__class__ = _JSONErrorServer  # same state; only the protocol factory differs
        return server
