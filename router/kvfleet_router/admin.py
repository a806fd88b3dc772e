"""The admin API: the operator's handle on a running router.

Everything under /admin needs `Authorization: Bearer <token>` (token from
--admin-token-file or KVFLEET_ADMIN_TOKEN); without a configured token every /admin call
is 401.

GET  /admin/config  -> {"version", "config": {...}, "endpoints": [{"name", "url", "role",
                        "revision", "state": active|draining|removed, "num_in_flight",
                        "num_pending" (of those, no first byte yet),
                        "peer_in_flight" (other router replicas', exchange.py),
                        "is_healthy"}], "revisions": {"<revision>": {"requests", "errors",
                        "ttft", "itl"}}}  (revisions: what the router measured per engine
                        revision since it started, revision_stats.RevisionCounts.to_dict)
PUT  /admin/config  (or POST) body = a whole config (see config.py). Validated first (400 with
                    the field path), then swapped in atomically. The version must be higher
                    than the current one (409 otherwise), except an identical re-push of the
                    current version, which is accepted as a no-op (safe operator retries).
In-flight requests keep running on the endpoint objects they hold; a removed endpoint is
listed with state "removed" until its in-flight count reaches 0.
"""

from __future__ import annotations

import hmac
import time

from aiohttp import web
from kvfleet_engine.contract.http_limits import JSONRejected, strict_loads

from kvfleet_router.config import ConfigError, RouterConfig
from kvfleet_router.config_store import ConfigStore, StaleVersion
from kvfleet_router.errors import error_response
from kvfleet_router.revisions import RevisionMeter


def is_authorized(header: str | None, token: str | None) -> bool:
    if not token or not header:
        return False
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                              token.encode())


def config_status(store: ConfigStore, meter: RevisionMeter | None = None) -> dict[str, object]:
    cfg = store.current
    now = time.monotonic()
    return {
        "version": cfg.version,
        "config": cfg.to_dict(),
        "endpoints": [
            {"name": e.name, "url": e.url, "role": e.role, "revision": e.revision,
             "state": e.state_name(), "num_in_flight": e.num_in_flight,
             "num_pending": e.num_pending, "peer_in_flight": e.peer_in_flight,
             "is_healthy": e.is_healthy(now)}
            for e in store.endpoints()
        ],
        "revisions": meter.to_dict() if meter is not None else {},
    }


class AdminAPI:
    """/admin/config over a ConfigStore, behind a bearer token; nothing else of the app.
    `meter`: the per-revision measurements GET answers (revisions.py)."""

    def __init__(self, store: ConfigStore, token: str | None,
                 meter: RevisionMeter | None = None) -> None:
        self.store = store
        self.token = token
        self.meter = meter

    @web.middleware
    async def auth(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.path == "/admin" or request.path.startswith("/admin/"):
            if not is_authorized(request.headers.get("Authorization"), self.token):
                return error_response("missing or invalid admin bearer token", 401,
                                      code="unauthorized",
                                      headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    async def get_config(self, request: web.Request) -> web.Response:
        return web.json_response(config_status(self.store, self.meter))

    async def put_config(self, request: web.Request) -> web.Response:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return error_response("config body too large", 413)
        try:
            data = strict_loads(raw)
        except JSONRejected as exc:
            return error_response(f"config refused: {exc}", 400, code=exc.code)
        try:
            cfg = RouterConfig.from_dict(data)
        except ConfigError as exc:
            return error_response(str(exc), 400, param=str(exc).split(":", 1)[0],
                                  code="invalid_config")
        try:
            applied = await self.store.push(cfg)
        except StaleVersion as exc:
            return error_response(str(exc), 409, param="version", code="stale_version")
        return web.json_response({"version": cfg.version, "applied": applied})

    def add_routes(self, webapp: web.Application) -> None:
        webapp.router.add_get("/admin/config", self.get_config)
        webapp.router.add_put("/admin/config", self.put_config)
        webapp.router.add_post("/admin/config", self.put_config)
