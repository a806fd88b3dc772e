"""The aiohttp application: routes, and one middleware that shapes every error.

Generation lives in `generate`, KV events in `kv_events`, P/D transfer in
`pd`, the peer prefix export in `kv_export`; this file wires them together with
/health, /v1/models and /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from kvfleet_engine.contract.peer_prefix import EXPORT_PATH
from kvfleet_engine.server import generate, kv_events, kv_export, pd
from kvfleet_engine.server.errors import SERVER_ERROR, APIError, error_body, type_for_status
from kvfleet_engine.server.metrics import CONTENT_TYPE
from kvfleet_engine.server.state import STATE_KEY, ServerState

log = logging.getLogger(__name__)


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as OpenAI's JSON error shape, never as a traceback."""
    try:
        return await handler(request)
    except APIError as exc:
        resp = web.json_response(exc.to_dict(), status=exc.status, headers=exc.headers)
        if exc.is_closing:
            resp.force_close()
        return resp
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        body = error_body(exc.reason or "error", type_for_status(exc.status))
        return web.json_response(body, status=exc.status)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # noqa: BLE001 - the one place unexpected errors are logged
        log.exception("unhandled error on %s %s", request.method, request.path)
        return web.json_response(error_body(f"internal error: {type(exc).__name__}",
                                            SERVER_ERROR), status=500)


async def handle_health(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    if not state.engine.is_alive:
        return web.json_response({"status": "engine stopped"}, status=503)
    if state.drain.is_admitting:
        return web.json_response({"status": "ok"})
    return web.json_response({"status": "draining"}, status=503)


async def handle_models(request: web.Request) -> web.Response:
    settings = request.app[STATE_KEY].settings
    created = int(time.time())
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "kvfleet",
         "root": settings.served_model_names[0], "max_model_len": settings.max_model_len}
        for name in settings.served_model_names
    ]
    return web.json_response({"object": "list", "data": data})


async def handle_version(request: web.Request) -> web.Response:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return web.json_response({"version": version("kvfleet")})
    except PackageNotFoundError:  # running from a source tree without install
        return web.json_response({"version": "unknown"})


async def handle_metrics(request: web.Request) -> web.Response:
    body = request.app[STATE_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def build_app(state: ServerState) -> web.Application:
    # client_max_size also bounds any body read outside read_json_body
    app = web.Application(middlewares=[openai_errors],
                          client_max_size=state.settings.max_body_bytes)
    app[STATE_KEY] = state
    app.router.add_post("/v1/completions", generate.handle_completions)
    app.router.add_post("/v1/chat/completions", generate.handle_chat)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/version", handle_version)
    app.router.add_get("/v1/kv_events", kv_events.handle_kv_events)
    app.router.add_get(pd.TRANSFER_PATH, pd.handle_kv_transfer)
    app.router.add_post(EXPORT_PATH, kv_export.handle_kv_export)
    return app
