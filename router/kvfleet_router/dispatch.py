"""Pick an endpoint (waiting in the priority queue when all are busy), forward, retry.

A retry goes to an endpoint not tried yet, and only while nothing reached the client.
The in-flight count is taken at the decision and released when the exchange ends, so
decisions between /metrics scrapes still see current load. With `kv_sharing.enabled`, a
unified request whose endpoint should fetch its prefix from a peer is forwarded with the
peer hint in `kv_transfer_params` (`with_peer_hint`: `pd_plan.peer_hint`, the rule the
simulator follows too; decided again on each attempt).
"""

from __future__ import annotations

import asyncio
import functools
import json
import time

from aiohttp import web
from multidict import CIMultiDict

from kvfleet_router.endpoint import EndpointState
from kvfleet_router.errors import error_response
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.pd_plan import peer_hint, with_kv_transfer_params
from kvfleet_router.proxy import BackendFailure, Forwarder, Outcome
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import Routed, RouterCore
from kvfleet_router.wait_queue import QueueFull, WaitQueue

_POLL_S = 0.05  # how often a queued head re-checks for capacity without a wake-up


class Rejected(Exception):
    def __init__(self, response: web.Response) -> None:
        super().__init__("rejected")
        self.response = response


class Dispatcher:
    """Built from what it uses: the routing core, the wait queue, the metrics, the
    forwarder and the health feedback (which it shares with the P/D prefill leg)."""

    def __init__(self, core: RouterCore, queue: WaitQueue, metrics: RouterMetrics,
                 forwarder: Forwarder, feedback: HealthFeedback) -> None:
        self.core = core
        self.queue = queue
        self.metrics = metrics
        self.forwarder = forwarder
        self.feedback = feedback
        self._request_counters: dict[tuple[str, str], object] = {}

    def try_route(self, info: RequestInfo, role: str, policy: str | None,
                  exclude: frozenset[str], allowed: frozenset[str] | None = None) -> Routed:
        core, metrics = self.core, self.metrics
        t0 = time.perf_counter()
        routed = core.route(info, role, time.monotonic(), policy, exclude, allowed)
        e = routed.decision.endpoint
        if e is not None:
            core.start(routed)
            self.feedback.attempt(e, routed.ctx.now)
        metrics.decision_seconds.observe(time.perf_counter() - t0)
        if e is not None:
            key = (e.name, routed.policy_name)
            counter = self._request_counters.get(key)
            if counter is None:
                counter = metrics.requests.labels(*key)
                self._request_counters[key] = counter
            counter.inc()  # type: ignore[attr-defined]
        return routed

    def _reject(self, reason: str) -> Rejected:
        cfg = self.core.cfg
        self.metrics.rejected.labels(reason).inc()
        if reason == "no-endpoint":
            return Rejected(error_response("no healthy endpoint can serve this request", 503,
                                           code="no_endpoint"))
        return Rejected(error_response(
            "all endpoints are saturated; retry later", 429, code="saturated",
            headers={"Retry-After": str(cfg.queue.retry_after_s)}))

    async def acquire(self, info: RequestInfo, role: str, policy: str | None,
                      exclude: frozenset[str], allowed: frozenset[str] | None = None) -> Routed:
        """Route now, or wait in the bounded priority queue; raises Rejected. `allowed`
        narrows the candidates (RouterCore.route); the HTTP front never sets it."""
        queue, qcfg = self.queue, self.core.cfg.queue
        reason = "saturated"
        if len(queue) == 0 or exclude:  # never overtake requests already waiting
            routed = self.try_route(info, role, policy, exclude, allowed)
            if routed.decision.endpoint is not None:
                return routed
            reason = routed.decision.reason
            if exclude and reason == "no-endpoint":
                raise self._reject("no-endpoint")  # a retry with nowhere else to go
        try:
            fut = queue.enter(info.priority)
        except QueueFull:
            raise self._reject("queue-full") from None
        deadline = time.monotonic() + qcfg.timeout_s
        if queue.is_head(fut):
            queue.wake()  # nobody ahead: try at once
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._reject(reason)
                # Only the head polls (for health or signal changes that wake nobody);
                # the others sleep until woken, since leave() wakes each new head.
                wait_s = min(remaining, _POLL_S) if queue.is_head(fut) else remaining
                try:
                    await asyncio.wait_for(asyncio.shield(fut), wait_s)
                except TimeoutError:
                    pass
                if fut.done():
                    fut = queue.rearm(fut)
                if queue.is_head(fut):
                    routed = self.try_route(info, role, policy, exclude, allowed)
                    if routed.decision.endpoint is not None:
                        return routed
                    reason = routed.decision.reason
        finally:
            queue.leave(fut)

    def release(self, e: EndpointState) -> None:
        self.core.finish(e)
        self.queue.wake()

    def with_peer_hint(self, raw: bytes, info: RequestInfo, routed: Routed, role: str) -> bytes:
        """The body to forward: `raw`, or the client's body plus a peer hint when the
        plan (`pd_plan.peer_hint`) says the endpoint should fetch the prefix."""
        asked = peer_hint(self.core, routed, role)
        if asked is None:
            return raw
        decision, hint = asked
        self.metrics.peer_hints.labels(decision.reason).inc()
        if hint is None:
            return raw
        self.metrics.peer_hint_blocks.inc(decision.num_blocks)
        return json.dumps(with_kv_transfer_params(info.body, hint)).encode()

    def _on_outcome(self, e: EndpointState, routed: Routed, outcome: Outcome) -> None:
        self.feedback.exchange_done(e, routed, outcome, time.monotonic())

    async def serve(self, request: web.Request, raw: bytes, info: RequestInfo, role: str,
                    policy: str | None, first: Routed | None = None,
                    headers: CIMultiDict[str] | None = None) -> web.StreamResponse:
        """Forward with retries; `first` is an already-acquired decision (P/D decode leg)."""
        tried: set[str] = set()
        attempts = self.core.cfg.retries.max_attempts
        last: BackendFailure | None = None
        for attempt in range(attempts):
            if first is not None and attempt == 0:
                routed = first
            else:
                try:
                    routed = await self.acquire(info, role, policy, frozenset(tried))
                except Rejected as rej:
                    if last is None:
                        return rej.response
                    break
            e = routed.decision.endpoint
            assert e is not None
            try:
                body = self.with_peer_hint(raw, info, routed, role)
                return await self.forwarder.forward(
                    request, e, body, functools.partial(self._on_outcome, e, routed), headers)
            except BackendFailure as exc:
                last = exc
                tried.add(e.name)
                self.feedback.failure(e, exc.kind, time.monotonic())
                if attempt + 1 < attempts:
                    self.metrics.retries.inc()
            finally:
                self.release(e)
        assert last is not None
        return error_response(f"upstream failed: {last}", last.status, code="upstream_error")
