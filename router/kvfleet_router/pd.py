"""Prefill/decode legs over HTTP for disaggregated pools: the aiohttp side of `pd_plan.py`.

`pd_plan.PDPlan` decides each step (decode first, whether a prefill leg runs, what it
sends, what the decode leg carries; the simulator runs the same plan); this module routes
the legs through the dispatcher, posts the prefill leg, and streams the decode leg back.
Both legs carry the same X-Request-Id, as vLLM's disaggregation proxy sends.

`Disaggregator` is built from what it uses: the routing core (roles, the config's
decider), the dispatcher (acquire, release, serve), the forwarder (the prefill side
call), the health feedback (the prefill leg's failures count like any other) and the
metrics (`kvfleet_router_pd_prefills_total{outcome}`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from aiohttp import web
from kvfleet_engine import contract
from multidict import CIMultiDict

from kvfleet_router.dispatch import Dispatcher, Rejected
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.pd_plan import (
    PDPlan,
    Planner,
    RoutePrefill,
    RunPrefill,
    Step,
    with_kv_transfer_params,
)
from kvfleet_router.proxy import BackendFailure, Forwarder, forward_headers
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore

log = logging.getLogger(__name__)
REQUEST_ID = "X-Request-Id"


def leg_headers(request: web.Request) -> CIMultiDict[str]:
    """Both legs carry the same X-Request-Id, as vLLM's disaggregation proxy sends."""
    headers = forward_headers(request.headers)
    if REQUEST_ID not in headers:
        headers[REQUEST_ID] = f"kvfleet-{uuid.uuid4().hex}"
    return headers


class Disaggregator:
    def __init__(self, core: RouterCore, dispatcher: Dispatcher, forwarder: Forwarder,
                 feedback: HealthFeedback, metrics: RouterMetrics) -> None:
        self.core = core
        self.dispatcher = dispatcher
        self.forwarder = forwarder
        self.feedback = feedback
        self.metrics = metrics
        self.planner = Planner(core)

    def same_revision(self, decode: EndpointState) -> frozenset[str] | None:
        """The endpoints a prefill leg for `decode` may use: those of its revision (P/D
        never pairs revisions: their KV layouts or weights may differ); None (any) when
        every endpoint runs the same one."""
        endpoints = self.core.registry.endpoints
        if all(e.revision == decode.revision for e in endpoints):
            return None
        return frozenset(e.name for e in endpoints if e.revision == decode.revision)

    async def run_prefill(self, request: web.Request, step: RunPrefill, info: RequestInfo,
                          headers: CIMultiDict[str]) -> dict[str, Any] | None:
        """The prefill leg; returns the engine's kv_transfer_params or None on any failure.
        Its engine gets the request's band as `priority` (the leg holds no seat, so it is
        never lifted; the decode leg gets its standing in `Dispatcher.serve`)."""
        e = step.endpoint
        sent = self.dispatcher.with_priority(json.dumps(step.body).encode(), info, e)
        started = time.perf_counter()
        try:
            status, body = await self.forwarder.post_json(e, request.path, sent, headers)
            if status != 200:
                log.warning("prefill on %s answered %s", e.name, status)
                return None
            self.feedback.prefill_leg_done(e, step.routed, time.perf_counter() - started,
                                           time.monotonic())
            params = json.loads(body).get(contract.KV_TRANSFER_PARAMS)
            return params if isinstance(params, dict) else None
        except BackendFailure as exc:
            self.feedback.failure(e, exc.kind, step.routed.ctx.now)
            return None
        except (ValueError, AttributeError):
            log.warning("prefill on %s returned a body without kv_transfer_params", e.name)
            return None
        finally:
            self.dispatcher.end(step.routed)

    async def serve(self, request: web.Request, raw: bytes, info: RequestInfo,
                    policy: str | None) -> web.StreamResponse:
        plan: PDPlan[dict[str, Any]] = PDPlan(self.planner, info)
        try:
            decode = await self.dispatcher.acquire(info, plan.role, policy, frozenset())
        except Rejected as rej:
            return rej.response
        headers = leg_headers(request)
        try:
            step: Step[dict[str, Any]] = plan.chosen(decode)
            if isinstance(step, RoutePrefill):
                step = plan.prefill_routed(self.dispatcher.try_route(
                    info, "prefill", policy, frozenset(),
                    self.same_revision(decode.decision.endpoint)))  # type: ignore[arg-type]
            if isinstance(step, RunPrefill):
                step = plan.prefill_done(await self.run_prefill(request, step, info, headers))
            if plan.prefill_outcome is not None:
                self.metrics.pd_prefills.labels(plan.prefill_outcome).inc()
            if step.kv is not None:
                raw = json.dumps(with_kv_transfer_params(info.body, step.kv)).encode()
                # a retried decode leg tries this revision first; on another it goes
                # without the KV (Dispatcher.serve): P/D never pairs revisions
                info.revision = info.kv_revision = step.endpoint.revision
        except BaseException:
            self.dispatcher.end(decode)
            raise
        return await self.dispatcher.serve(request, raw, info, plan.role, policy, first=decode,
                                           headers=headers)
