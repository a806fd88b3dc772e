"""The admin API: the operator's handle on a running router.

Everything under /admin needs `Authorization: Bearer <token>` (token from
--admin-token-file or KVFLEET_ADMIN_TOKEN); without a configured token every /admin call
is 401.

GET  /admin/config  -> {"version", "config": {...}, "endpoints": [{"name", "url", "role",
                        "state": active|draining|removed, "num_in_flight", "is_healthy"}]}
PUT  /admin/config  (or POST) body = a whole config (see config.py). Validated first (400 with
                    the field path), then swapped in atomically. The version must be higher
                    than the current one (409 otherwise), except an identical re-push of the
                    current version, which is accepted as a no-op (safe operator retries).
In-flight requests keep running on the endpoint objects they hold; a removed endpoint is
listed with state "removed" until its in-flight count reaches 0.
"""

from __future__ import annotations

import hmac
import json
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kvfleet_router.config import ConfigError, RouterConfig
from kvfleet_router.errors import error_response

if TYPE_CHECKING:
    from kvfleet_router.app import RouterApp

ROUTER_KEY: web.AppKey[Any] = web.AppKey("kvfleet_router")


def is_authorized(header: str | None, token: str | None) -> bool:
    if not token or not header:
        return False
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              token.encode())


@web.middleware
async def admin_auth(request: web.Request, handler):  # type: ignore[no-untyped-def]
    if request.path == "/admin" or request.path.startswith("/admin/"):
        app: RouterApp = request.app[ROUTER_KEY]
        if not is_authorized(request.headers.get("Authorization"), app.admin_token):
            return error_response("missing or invalid admin bearer token", 401,
                                  code="unauthorized",
                                  headers={"WWW-Authenticate": "Bearer"})
    return await handler(request)


def config_status(app: RouterApp) -> dict[str, object]:
    core = app.core
    now = time.monotonic()
    return {
        "version": core.cfg.version,
        "config": core.cfg.to_dict(),
        "endpoints": [
            {"name": e.name, "url": e.url, "role": e.role, "state": e.state_name(),
             "num_in_flight": e.num_in_flight, "is_healthy": e.is_healthy(now)}
            for e in core.registry.all_endpoints()
        ],
    }


async def get_config(request: web.Request) -> web.Response:
    return web.json_response(config_status(request.app[ROUTER_KEY]))


async def put_config(request: web.Request) -> web.Response:
    app: RouterApp = request.app[ROUTER_KEY]
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return error_response("config body too large", 413)
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return error_response(f"config is not valid JSON: {exc}", 400)
    try:
        cfg = RouterConfig.from_dict(data)
    except ConfigError as exc:
        return error_response(str(exc), 400, param=str(exc).split(":", 1)[0],
                              code="invalid_config")
    async with app.config_lock:
        current = app.core.cfg
        if cfg.version == current.version and cfg.to_dict() == current.to_dict():
            return web.json_response({"version": cfg.version, "applied": False})
        if cfg.version <= current.version:
            return error_response(
                f"stale config version {cfg.version}; current is {current.version}", 409,
                param="version", code="stale_version")
        app.apply_config(cfg)
    return web.json_response({"version": cfg.version, "applied": True})


def add_routes(webapp: web.Application) -> None:
    webapp.router.add_get("/admin/config", get_config)
    webapp.router.add_put("/admin/config", put_config)
    webapp.router.add_post("/admin/config", put_config)
