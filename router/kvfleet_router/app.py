"""The router's aiohttp application: wiring and lifecycle only.

    app = RouterApp(cfg, admin_token="...")
    web.run_app(app.build(), host="127.0.0.1", port=8080)

Each piece gets only what it uses:
- RouterCore (router_core.py): registry, prefix indexes, policies; no I/O, no app state.
- WaitQueue, RouterMetrics, Forwarder (owns the one pooled ClientSession).
- HealthFeedback (feedback.py): breaker and learning updates from finished exchanges.
- Dispatcher (core, queue, metrics, forwarder, feedback): route or queue, forward, retry.
- Disaggregator (core, dispatcher, forwarder, feedback, metrics): P/D legs, with a
  pluggable decider (pd_deciders.py).
- ConfigStore (core): versioned, atomic config swaps; listeners follow each swap.
- QuotaGate (config getter, API keys): tenant by API key (401), per-tenant quotas (429),
  x-ratelimit-* headers on every answer of a limited tenant (on_response_prepare).
- Exchange (core, token, sibling workers, the split): state shared with the pool's other
  router replicas and workers (exchange.py), its two /admin/exchange routes and a task.
- AdminAPI (store, token), OpenAIFront and StatusFront (front.py): the HTTP handlers.
Background tasks probe /health, scrape /metrics and (for precise endpoints) follow
/v1/kv_events, all over the forwarder's session.
With `epp` options, the same core, dispatcher and feedback also serve the gRPC ext_proc
front (epp/: a Gateway API Inference Extension Endpoint Picker), started and stopped
with the app; its readiness follows the config (ready once it names an endpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from kvfleet_router import health, signals
from kvfleet_router.admin import AdminAPI
from kvfleet_router.api_keys import ApiKeys
from kvfleet_router.config import MAX_BODY_BYTES_CEILING, RouterConfig
from kvfleet_router.config_store import ConfigStore
from kvfleet_router.dispatch import Dispatcher
from kvfleet_router.epp.options import EppOptions
from kvfleet_router.errors import json_errors
from kvfleet_router.exchange import Exchange, ExchangeCollector
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.front import OpenAIFront, StatusFront
from kvfleet_router.kv_events import KVEventFollowers
from kvfleet_router.metrics import RouterMetrics, fairness
from kvfleet_router.pd import Disaggregator
from kvfleet_router.proxy import Forwarder
from kvfleet_router.quota_gate import QuotaGate
from kvfleet_router.revisions import RevisionCollector
from kvfleet_router.router_core import RouterCore
from kvfleet_router.wait_queue import WaitQueue


class RouterApp:
    def __init__(self, cfg: RouterConfig, admin_token: str | None = None,
                 epp: EppOptions | None = None, api_keys: ApiKeys | None = None,
                 exchange_siblings: list[str] | None = None) -> None:
        """`exchange_siblings`: the private URLs of this pod's other workers (workers.py),
        peers of the state exchange whatever the config says."""
        core = self.core = RouterCore(cfg)
        self.exchange_siblings = list(exchange_siblings or [])
        queue = self.queue = WaitQueue(cfg.queue.max_size, cfg.flow_control)
        metrics = self.metrics = RouterMetrics(lambda: core, lambda: len(queue),
                                               band_lengths=queue.band_lengths,
                                               fairness=lambda: fairness(queue))
        forwarder = self.forwarder = Forwarder(cfg.timeouts)
        feedback = HealthFeedback(metrics, lambda: core.cfg)
        dispatcher = Dispatcher(core, queue, metrics, forwarder, feedback)
        forwarder.meter = dispatcher.meter  # per-revision outcomes (revisions.py)
        metrics.registry.register(RevisionCollector(dispatcher.meter))
        self._dispatcher, self._feedback, self.epp_options = dispatcher, feedback, epp
        self.epp_server: Any = None  # an epp.server.EppServer once started
        self.epp_port = 0
        disaggregator = Disaggregator(core, dispatcher, forwarder, feedback, metrics)
        self.exchange = Exchange(core, admin_token, self.exchange_siblings, dispatcher.split)
        metrics.registry.register(ExchangeCollector(self.exchange))
        self.store = ConfigStore(core)
        self.store.on_apply(lambda c: forwarder.set_timeouts(c.timeouts))
        self.store.on_apply(self._resize_queue)
        self.admin = AdminAPI(self.store, admin_token, dispatcher.meter)
        self.gate = QuotaGate(lambda: core.cfg, api_keys, on_reject=dispatcher.count_refusal)
        self.store.on_apply(self.gate.configure)
        self.front = OpenAIFront(core, dispatcher, disaggregator, forwarder, self.gate)
        self.status = StatusFront(core, metrics)
        self._followers: KVEventFollowers | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def _resize_queue(self, cfg: RouterConfig) -> None:
        self.queue.max_size = cfg.queue.max_size
        self.queue.configure(cfg.flow_control)
        self.queue.wake()  # the head may fit somewhere new (or the first endpoint came)

    def _sync_followers(self, cfg: RouterConfig) -> None:
        if self._followers is not None:
            self._followers.sync(self.core.registry.endpoints)

    # --- lifecycle ---
    async def _startup(self, _: web.Application) -> None:
        session = await self.forwarder.open()
        cfg = lambda: self.core.cfg  # noqa: E731 - always the config in force
        eps = lambda: self.core.registry.endpoints  # noqa: E731
        self._tasks = [
            asyncio.create_task(health.probe_forever(
                session, eps, lambda: cfg().health.probe_interval_s,
                lambda: cfg().health.probe_timeout_s, self.queue.wake)),
            asyncio.create_task(signals.poll_forever(
                session, eps, lambda: cfg().signals.poll_interval_s,
                lambda: cfg().signals.stale_after_s)),
        ]
        self._tasks.append(asyncio.create_task(self.exchange.run()))
        self._followers = KVEventFollowers(session, self.core.precise)
        self._followers.sync(eps())
        self.store.on_apply(self._sync_followers)
        if self.epp_options is not None:
            await self._start_epp(self.epp_options)

    async def _start_epp(self, opts: EppOptions) -> None:
        from kvfleet_router.epp.exchange import Picker
        from kvfleet_router.epp.server import EppServer

        server = EppServer(Picker(self.core, self._dispatcher, self._feedback, opts,
                                  self.gate), opts)
        self.epp_port = await server.start()
        self.epp_server = server

        def follow(cfg: RouterConfig) -> None:
            task = asyncio.get_running_loop().create_task(
                server.set_ready(bool(cfg.endpoints)))
            self._tasks = [t for t in self._tasks if not t.done()] + [task]

        follow(self.core.cfg)
        self.store.on_apply(follow)

    async def _cleanup(self, _: web.Application) -> None:
        tasks = self._tasks + (self._followers.tasks() if self._followers else [])
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.epp_server is not None:
            await self.epp_server.stop()
        await self.forwarder.close()
        self.core.text_tokens.close()  # its tokenizer thread pool (text_tokens.py)

    def build(self) -> web.Application:
        webapp = web.Application(middlewares=[json_errors, self.admin.auth],
                                 client_max_size=MAX_BODY_BYTES_CEILING)  # config: less
        webapp.router.add_post("/v1/completions", self.front.completions)
        webapp.router.add_post("/v1/chat/completions", self.front.completions)
        webapp.router.add_get("/v1/models", self.front.models)
        webapp.router.add_get("/health", self.status.health)
        webapp.router.add_get("/metrics", self.status.metrics_text)
        self.admin.add_routes(webapp)
        self.exchange.add_routes(webapp)
        webapp.on_response_prepare.append(self.gate.on_prepare)  # x-ratelimit-* headers
        webapp.on_startup.append(self._startup)
        webapp.on_cleanup.append(self._cleanup)
        return webapp
