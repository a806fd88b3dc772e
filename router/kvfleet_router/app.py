"""The router's aiohttp application: OpenAI-compatible proxy, /metrics, /health, admin API.

    app = RouterApp(cfg, admin_token="...")
    web.run_app(app.build(), host="127.0.0.1", port=8080)

One ClientSession with pooled keep-alive connections serves every backend; background
tasks probe /health, scrape /metrics and (for precise endpoints) follow /v1/kv_events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aiohttp
from aiohttp import web

from kvfleet_router import admin, health, kv_events, signals
from kvfleet_router.config import RouterConfig
from kvfleet_router.dispatch import Dispatcher
from kvfleet_router.errors import RequestError, error_response
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.pd import serve_disaggregated
from kvfleet_router.policies.policy import POLICIES
from kvfleet_router.proxy import Forwarder
from kvfleet_router.request_info import parse_request
from kvfleet_router.router_core import RouterCore
from kvfleet_router.wait_queue import WaitQueue

log = logging.getLogger(__name__)


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None:
        if request.content_length > limit:
            raise RequestError(f"request body exceeds {limit} bytes", status=413,
                               code="body_too_large")
        return await request.read()  # the common case: one C-level read
    chunks: list[bytes] = []  # chunked upload: count as it arrives
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"request body exceeds {limit} bytes", status=413,
                               code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


@web.middleware
async def json_errors(request: web.Request, handler):  # type: ignore[no-untyped-def]
    try:
        return await handler(request)
    except RequestError as exc:
        return error_response(str(exc), exc.status, exc.param, exc.code)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.reason, exc.status)
    except Exception:  # a bug must still answer in OpenAI's shape, and be logged
        log.exception("unexpected error serving %s", request.path)
        return error_response("internal router error", 500, code="internal_error")


class RouterApp:
    def __init__(self, cfg: RouterConfig, admin_token: str | None = None) -> None:
        self.core = RouterCore(cfg)
        self.admin_token = admin_token
        self.queue = WaitQueue(cfg.queue.max_size)
        self.metrics = RouterMetrics(lambda: self.core, lambda: len(self.queue))
        self.dispatcher = Dispatcher(self)
        self.config_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribers: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self.session: aiohttp.ClientSession | None = None
        self.forwarder: Forwarder

    # --- config ---
    def apply_config(self, cfg: RouterConfig) -> None:
        """Swap in a validated config; running requests keep their endpoint objects."""
        self.core.apply(cfg)
        self.queue.max_size = cfg.queue.max_size
        if self.session is not None:
            self.forwarder.set_timeouts(cfg.timeouts)
            self._sync_subscribers()
        self.queue.wake()
        log.info("config version %d applied (%d endpoints, policy %s)", cfg.version,
                 len(cfg.endpoints), cfg.policy.name)

    def has_role(self, role: str) -> bool:
        return any(e.role == role for e in self.core.registry.endpoints)

    def _sync_subscribers(self) -> None:
        assert self.session is not None
        wanted = {e.name: e.url for e in self.core.registry.endpoints
                  if e.prefix_mode == "precise"}
        for name, (url, task) in list(self._subscribers.items()):
            if wanted.get(name) != url:
                task.cancel()
                del self._subscribers[name]
        for name, url in wanted.items():
            if name not in self._subscribers:
                task = asyncio.create_task(kv_events.subscribe_forever(
                    self.session, name, url, self.core.precise))
                self._subscribers[name] = (url, task)

    # --- lifecycle ---
    async def _startup(self, _: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30,
                                         ttl_dns_cache=300)
        # No cookies between unrelated clients' requests, and no per-request jar work.
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                             cookie_jar=aiohttp.DummyCookieJar())
        self.forwarder = Forwarder(self.session, self.core.cfg.timeouts)
        cfg = lambda: self.core.cfg  # noqa: E731 - always the config in force
        eps = lambda: self.core.registry.endpoints  # noqa: E731
        self._tasks = [
            asyncio.create_task(health.probe_forever(
                self.session, eps, lambda: cfg().health.probe_interval_s,
                lambda: cfg().health.probe_timeout_s, self.queue.wake)),
            asyncio.create_task(signals.poll_forever(
                self.session, eps, lambda: cfg().signals.poll_interval_s,
                lambda: cfg().signals.stale_after_s)),
        ]
        self._sync_subscribers()

    async def _cleanup(self, _: web.Application) -> None:
        tasks = self._tasks + [t for _, t in self._subscribers.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.session is not None:
            await self.session.close()

    # --- handlers ---
    async def completions(self, request: web.Request) -> web.StreamResponse:
        cfg = self.core.cfg
        raw = await read_body(request, cfg.limits.max_body_bytes)
        info = parse_request(raw, request.path, request.headers, cfg.session.header,
                             cfg.session.use_user_field)
        policy = None
        if cfg.policy.allow_override:
            policy = request.headers.get(cfg.policy.override_header) or None
            if policy is not None and policy not in POLICIES:
                raise RequestError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}",
                                   param=cfg.policy.override_header)
        if info.model and self._is_unknown_model(info.model):
            raise RequestError(f"The model `{info.model}` does not exist.", param="model",
                               status=404, code="model_not_found")
        if self.has_role("decode"):
            return await serve_disaggregated(self, request, raw, info, policy)
        return await self.dispatcher.serve(request, raw, info, "unified", policy)

    def _is_unknown_model(self, model: str) -> bool:
        eps = self.core.registry.endpoints
        return bool(eps) and all(e.models and model not in e.models for e in eps)

    async def models(self, request: web.Request) -> web.Response:
        assert self.session is not None
        now = time.monotonic()
        eps = [e for e in self.core.registry.endpoints if e.is_healthy(now)]

        async def one(url: str) -> list[dict[str, object]]:
            try:
                async with self.session.get(  # type: ignore[union-attr]
                        url + "/v1/models", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    body = await resp.json()
                    return [m for m in body.get("data", []) if isinstance(m, dict)]
            except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
                return []

        seen: dict[str, dict[str, object]] = {}
        for items in await asyncio.gather(*(one(e.url) for e in eps)):
            for m in items:
                seen.setdefault(str(m.get("id")), m)
        if not seen and not eps:
            return error_response("no healthy endpoint", 503, code="no_endpoint")
        return web.json_response({"object": "list", "data": list(seen.values())})

    async def health_handler(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        eps = self.core.registry.endpoints
        return web.json_response({"status": "ok", "config_version": self.core.cfg.version,
                                  "num_endpoints": len(eps),
                                  "num_healthy": sum(e.is_healthy(now) for e in eps)})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4"})

    def build(self) -> web.Application:
        webapp = web.Application(middlewares=[json_errors, admin.admin_auth],
                                 client_max_size=16 * 1024 * 1024)
        webapp[admin.ROUTER_KEY] = self
        webapp.router.add_post("/v1/completions", self.completions)
        webapp.router.add_post("/v1/chat/completions", self.completions)
        webapp.router.add_get("/v1/models", self.models)
        webapp.router.add_get("/health", self.health_handler)
        webapp.router.add_get("/metrics", self.metrics_handler)
        admin.add_routes(webapp)
        webapp.on_startup.append(self._startup)
        webapp.on_cleanup.append(self._cleanup)
        return webapp
