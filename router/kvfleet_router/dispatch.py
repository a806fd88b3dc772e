"""Pick an endpoint (waiting in the priority queue when all are busy), forward, retry.

A retry goes to an endpoint not tried yet, and only while nothing reached the client.
The in-flight count is taken at the decision and released when the exchange ends, so
decisions between /metrics scrapes still see current load. With `kv_sharing.enabled`, a
unified request whose endpoint should fetch its prefix from a peer is forwarded with the
peer hint in `kv_transfer_params` (`with_peer_hint`: `pd_plan.peer_hint`, the rule the
simulator follows too; decided again on each attempt).

A stream whose endpoint breaks after the first byte continues on another endpoint
(`migration`, migration.py): each continuation is routed as a retry is (past the queue,
never to an endpoint already tried), and the client sees one stream.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.errors import error_response
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.flow.gate import FlowGate
from kvfleet_router.flow.saturation import is_ready
from kvfleet_router.flow.seats import Seat, standing
from kvfleet_router.flow.tenants import Flow, TenantLabels, request_flow
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.migration import (
    CHAT_PATH,
    Splice,
    StreamLedger,
    closing_events,
    continuation,
    is_migratable,
    remaining_tokens,
    strip_token_ids,
)
from kvfleet_router.pd_plan import peer_hint, with_kv_transfer_params
from kvfleet_router.proxy import (
    CLIENT_GONE,
    DONE,
    REFUSED,
    BackendFailure,
    Forwarder,
    Outcome,
    StreamBroken,
    forward_headers,
)
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.revisions import RevisionMeter, RevisionSplit
from kvfleet_router.router_core import Routed, RouterCore
from kvfleet_router.wait_queue import QueueFull, WaitQueue

_POLL_S = 0.05  # how often a queued head re-checks for capacity without a wake-up
_GONE_POLL_S = 0.1  # how often a queued request looks whether its client is still there
DROP_REASON_HEADER = "x-kvfleet-drop-reason"


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
        # (family, band, tenant label) -> the flow series' child: labels() costs a lock
        # and label checks on each call; bounded by the tenant labels (flow/tenants.py)
        self._flow_children: dict[tuple[int, str, str], Any] = {}
        self._labels = TenantLabels(core.cfg.flow_control.max_tenant_labels)
        self.gate = FlowGate(queue.service)  # seats, standings and what tenants were served
        self.split = RevisionSplit()  # the rollout's traffic split (revisions.py)
        self.meter = RevisionMeter()  # per-revision outcomes; the forwarder fills it too
        self._split_cfg: RouterConfig | None = None
        self._zero_default_series()

    def _zero_default_series(self) -> None:
        """The default tenant's flow series exist from the start, at 0 (Prometheus' advice
        for known label sets), so dashboards and alerts see them before anything queues."""
        m = self.metrics
        flow = self._flow(RequestInfo(tenant=self.core.cfg.flow_control.default_tenant))
        for family in (m.flow_queued, m.flow_dispatched, m.flow_tokens, m.flow_queue_seconds):
            family.labels(flow.band_label, flow.label)
        for reason in ("saturated", "queue-full", "no-endpoint", "client-gone",
                       "quota-requests", "quota-tokens"):
            m.flow_rejected.labels(flow.band_label, flow.label, reason)

    def try_route(self, info: RequestInfo, role: str, policy: str | None,
                  exclude: frozenset[str], allowed: frozenset[str] | None = None,
                  outranked: dict[str, int] | None = None) -> Routed:
        core, metrics = self.core, self.metrics
        t0 = time.perf_counter()
        routed = core.route(info, role, time.monotonic(), policy, exclude, allowed, outranked)
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

    def _reject(self, reason: str, flow: Flow | None = None) -> Rejected:
        """Refuse with OpenAI's error shape and `x-kvfleet-drop-reason`: 503 when no
        endpoint is ready (none configured, all starting or unhealthy), 499 when the client
        left while queued, else 429 with Retry-After (saturated past the TTL, queue full)."""
        cfg = self.core.cfg
        self.metrics.rejected.labels(reason).inc()
        if flow is not None:
            self.metrics.flow_rejected.labels(flow.band_label, flow.label, reason).inc()
        headers = {DROP_REASON_HEADER: reason}
        if reason == "no-endpoint":
            return Rejected(error_response("no healthy endpoint can serve this request", 503,
                                           code="no_endpoint", headers=headers))
        if reason == "client-gone":
            return Rejected(error_response("client closed the connection while queued",
                                           499, code="client_gone", headers=headers))
        headers["Retry-After"] = str(cfg.queue.retry_after_s)
        what = ("the queue for this priority band is full" if reason == "queue-full" else
                "all endpoints are saturated")
        return Rejected(error_response(f"{what}; retry later", 429, code="saturated",
                                       headers=headers))

    def count_refusal(self, reason: str, tenant: str | None) -> None:
        """A refusal before dispatch (the quota gate's): per reason, and per band and
        tenant when one was refused (a quota), beside flow control's own."""
        self.metrics.rejected.labels(reason).inc()
        if tenant is not None:
            flow = self._flow(RequestInfo(tenant=tenant))
            self.metrics.flow_rejected.labels(flow.band_label, flow.label, reason).inc()

    def _flow(self, info: RequestInfo) -> Flow:
        fc = self.core.cfg.flow_control
        self._labels.max_labels = fc.max_tenant_labels
        return request_flow(fc, info.tenant, info.priority, self._labels.label(info.tenant, fc))

    def follow_config(self) -> RevisionSplit:
        """The split of the config in force (rebuilt after a push, which also forgets the
        measurements of revisions no longer in it)."""
        cfg = self.core.cfg
        if self._split_cfg is not cfg:
            self.split.configure(cfg.revisions)
            self.meter.keep_only({e.revision for e in cfg.endpoints}
                                 | set(cfg.revisions.weights if cfg.revisions else ()))
            self._split_cfg = cfg
        return self.split

    def _route_now(self, info: RequestInfo, role: str, policy: str | None,
                   exclude: frozenset[str], allowed: frozenset[str] | None,
                   flow: Flow, outranking_only: bool = False) -> Routed | str:
        """A decision, or why none (flow/gate.py: no-endpoint when none is ready, saturated
        when all are for this request; a stale scrape counts as saturated, seats the
        request outranks do not). `outranking_only`: it may pass the queue only there.
        With a traffic split, the request's revision's endpoints first, then the
        fallbacks (revisions.py); the reason is the most hopeful one (saturated)."""
        core = self.core
        why = "no-endpoint"
        for endpoints in self.follow_config().pools(core.registry.endpoints, info.revision):
            got = self.gate.candidates(flow, endpoints, role, time.monotonic(),
                                       core.cfg.saturation, exclude, allowed, outranking_only)
            if isinstance(got, str):
                if got == "saturated":
                    why = got
                continue
            free, outranked = got
            routed = self.try_route(info, role, policy, exclude, free, outranked)
            e = routed.decision.endpoint
            if e is None:
                why = "saturated"
                continue
            routed.seat = self.gate.take(flow, e, time.monotonic())
            return routed
        return why

    def _dispatch_charge(self, info: RequestInfo) -> int:
        """What a tenant is charged when its request is dispatched: the prompt (estimated)
        and `max_tokens`; the unused part is refunded when the exchange ends."""
        return info.estimated_prompt_tokens(self.core.cfg.prefix.chars_per_token) \
            + info.max_tokens

    def _flow_child(self, family: Any, flow: Flow) -> Any:
        """`family.labels(band, tenant)`, looked up once per flow."""
        key = (id(family), flow.band_label, flow.label)
        child = self._flow_children.get(key)
        if child is None:
            child = self._flow_children[key] = family.labels(flow.band_label, flow.label)
        return child

    def _dispatched(self, info: RequestInfo, flow: Flow, routed: Routed) -> Routed:
        self.gate.charge(info.tenant, self._dispatch_charge(info), time.monotonic())
        self._flow_child(self.metrics.flow_dispatched, flow).inc()
        return routed

    async def acquire(self, info: RequestInfo, role: str, policy: str | None,
                      exclude: frozenset[str], allowed: frozenset[str] | None = None,
                      is_gone: Callable[[], bool] | None = None,
                      flow: Flow | None = None) -> Routed:
        """Route now, or wait in the bounded fair queue (flow/) until dispatched or its TTL
        (`queue.timeout_s`) passes; raises Rejected. `allowed` narrows the candidates
        (RouterCore.route; the HTTP front never sets it); `is_gone()` says the client left
        (the queued request then leaves at once: aiohttp does not cancel handlers).
        `flow`: the request's standing when the caller already has it (`serve`)."""
        queue, qcfg = self.queue, self.core.cfg.queue
        flow = flow or self._flow(info)
        if info.revision is None:  # once per request: its retries keep the revision
            info.revision = self.follow_config().assign(info.session_key)
        now = time.monotonic()
        # Never overtake the ones waiting, except on seats it outranks (flow/seats.py: a
        # tenant under its share passes the flood's queue as it passes the flood's seats).
        leads = queue.would_lead(flow.band) or bool(exclude)
        got = self._route_now(info, role, policy, exclude, allowed, flow, not leads)
        if not isinstance(got, str):
            return self._dispatched(info, flow, got)
        if exclude and got == "no-endpoint":
            raise self._reject("no-endpoint", flow)  # a retry with nowhere else to go
        expires = now + qcfg.timeout_s
        order_by = min(expires, now + info.slo_ttft_s) if info.slo_ttft_s else expires
        try:
            fut = queue.enter(info.priority, tenant=info.tenant, band=flow.band,
                              weight=flow.weight, deadline=order_by)
        except QueueFull:
            raise self._reject("queue-full", flow) from None
        self.metrics.flow_queued.labels(flow.band_label, flow.label).inc()
        if queue.is_head(fut):
            queue.wake()  # nobody ahead: try at once
        try:
            while True:
                remaining = expires - time.monotonic()
                if remaining <= 0:  # why, as of now: none ready, or all saturated
                    at = time.monotonic()
                    is_any_ready = any(
                        is_ready(e, role, at) for e in self.core.registry.endpoints
                        if e.name not in exclude and (allowed is None or e.name in allowed))
                    raise self._reject("saturated" if is_any_ready else "no-endpoint", flow)
                # The head polls (for health or signal changes that wake nobody); the
                # others sleep until woken (leave() wakes each new head), or until the
                # next look at their client.
                wait_s = min(remaining, _POLL_S) if queue.is_head(fut) else remaining
                if is_gone is not None:
                    wait_s = min(wait_s, _GONE_POLL_S)
                try:
                    await asyncio.wait_for(asyncio.shield(fut), wait_s)
                except TimeoutError:
                    pass
                if is_gone is not None and is_gone():
                    raise self._reject("client-gone", flow)
                if fut.done():
                    fut = queue.rearm(fut)
                if queue.is_head(fut):
                    got = self._route_now(info, role, policy, exclude, allowed, flow)
                    if not isinstance(got, str):
                        self.metrics.flow_queue_seconds.labels(
                            flow.band_label, flow.label).observe(time.monotonic() - now)
                        return self._dispatched(info, flow, got)
        finally:
            queue.leave(fut)

    def release(self, e: EndpointState, seat: Seat | None = None) -> None:
        """The exchange on `e` ended; `seat`: the one `acquire` took (Routed.seat)."""
        if seat is not None:
            self.gate.give_back(seat)
        self.core.finish(e)
        self.queue.wake()

    def end(self, routed: Routed) -> None:
        """The exchange `routed` started ended, with or without a first byte: no longer
        pending on its endpoint, and released."""
        e = routed.decision.endpoint
        assert e is not None
        self.core.first_byte(routed)
        self.release(e, routed.seat)

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

    def with_priority(self, body: bytes, info: RequestInfo, e: EndpointState,
                      seat: Seat | None = None) -> bytes:
        """The body with the request's standing on `e` (`seat`, flow/seats.py: twice its
        tenant's band or its own lower priority, less one while its tenant is under its
        share there) as `priority`, for engines that order and preempt by it; vLLM only
        with `forward_priority_to_vllm`. Untouched (no copy) when the body already says
        so, which is the default tenant's common case. Without a seat: the standing of a
        tenant not under its share."""
        fc = self.core.cfg.flow_control
        if not fc.forward_priority or (e.engine == "vllm" and not fc.forward_priority_to_vllm):
            return body
        want = seat.standing if seat is not None else \
            standing(self._flow(info).engine_priority, False)
        if info.body.get("priority", 0) == want:
            return body
        data = json.loads(body)  # the body as forwarded (a peer hint may be in it)
        data["priority"] = want
        return json.dumps(data).encode()

    def _on_outcome(self, e: EndpointState, routed: Routed, info: RequestInfo, flow: Flow,
                    outcome: Outcome) -> None:
        self.feedback.exchange_done(e, routed, outcome, time.monotonic())
        # What the tenant was served: the prompt, and the output actually streamed (else
        # max_tokens, as charged at dispatch); the difference is refunded to its service.
        output = min(outcome.num_events, info.max_tokens) if outcome.is_stream \
            else info.max_tokens
        if output < info.max_tokens:
            self.gate.charge(info.tenant, output - info.max_tokens, time.monotonic())
        self._flow_child(self.metrics.flow_tokens, flow).inc(
            info.estimated_prompt_tokens(self.core.cfg.prefix.chars_per_token) + output)

    async def serve(self, request: web.Request, raw: bytes, info: RequestInfo, role: str,
                    policy: str | None, first: Routed | None = None,
                    headers: CIMultiDict[str] | None = None) -> web.StreamResponse:
        """Forward with retries; `first` is an already-acquired decision (P/D decode leg)."""
        tried: set[str] = set()
        attempts = self.core.cfg.retries.max_attempts
        flow = self._flow(info)  # once per request, not per attempt
        mc = self.core.cfg.migration
        ledger = StreamLedger() if mc.enabled and is_migratable(request.path, info.body) \
            else None
        ask_ids = ledger is not None and mc.token_ids and not info.body.get("return_token_ids")
        last: BackendFailure | None = None
        broken: StreamBroken | None = None
        for attempt in range(attempts):
            if first is not None and attempt == 0:
                routed = first
            else:
                try:
                    routed = await self.acquire(info, role, policy, frozenset(tried),
                                                is_gone=functools.partial(_is_gone, request),
                                                flow=flow)
                except Rejected as rej:
                    if last is None:
                        return rej.response
                    break
            e = routed.decision.endpoint
            assert e is not None
            try:
                body = self.with_priority(self.with_peer_hint(
                    raw if info.kv_revision in (None, e.revision) else
                    json.dumps(info.body).encode(),  # a prefill's KV stays in its revision
                    info, routed, role), info, e, routed.seat)
                if ask_ids:
                    body = _with_return_token_ids(body)
                return await self.forwarder.forward(
                    request, e, body, functools.partial(self._on_outcome, e, routed, info, flow),
                    headers, ledger, ask_ids, functools.partial(self.core.first_byte, routed))
            except BackendFailure as exc:
                last = exc
                tried.add(e.name)
                self.feedback.failure(e, exc.kind, time.monotonic())
                if attempt + 1 < attempts:
                    self.metrics.retries.inc()
            except StreamBroken as exc:
                tried.add(e.name)
                broken = exc
                break
            finally:
                self.end(routed)
        if broken is not None:
            return await self._migrate(request, broken, info, role, policy, flow, tried,
                                       headers)
        assert last is not None
        return error_response(f"upstream failed: {last}", last.status, code="upstream_error")

    async def _migrate(self, request: web.Request, broken: StreamBroken, info: RequestInfo,
                       role: str, policy: str | None, flow: Flow, tried: set[str],
                       headers: CIMultiDict[str] | None) -> web.StreamResponse:
        """Continue a broken stream on other endpoints until it ends whole: at most
        `migration.max_migrations` continuations, each tried on up to
        `retries.max_attempts` endpoints before its first byte."""
        out, ledger, reason = broken.out, broken.ledger, str(broken)
        cfg = self.core.cfg
        body = info.body
        is_chat = request.path == CHAT_PATH
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        strip_ids = cfg.migration.token_ids and not body.get("return_token_ids")
        leg_headers = headers if headers is not None else forward_headers(request.headers)
        for _ in range(cfg.migration.max_migrations):
            st = ledger.state()
            remaining = remaining_tokens(body, st)
            if st.has_error or st.is_done:  # the engine ended it itself: nothing to add
                await self.forwarder.end(out)
                return out
            if st.finish_reason is not None or (remaining is not None and remaining <= 0):
                await _write_all(out, closing_events(st, is_chat, remaining,
                                                     include_usage and not st.has_usage))
                self.metrics.migrations.labels("continued").inc()
                await self.forwarder.end(out)
                return out
            plan = continuation(request.path, body, st, cfg.migration.token_ids)
            if plan is None:
                return await self._give_up(out, "failed", f"{reason}; it cannot be continued "
                                           "(a token-id prompt, and no generated ids)")
            for _attempt in range(cfg.retries.max_attempts):
                try:
                    routed = await self.acquire(info, role, policy, frozenset(tried),
                                                is_gone=functools.partial(_is_gone, request),
                                                flow=flow)
                except Rejected:
                    return await self._give_up(out, "failed", f"{reason}; no endpoint to continue")
                e = routed.decision.endpoint
                assert e is not None
                ending = CLIENT_GONE  # should the handler be cancelled
                num_events = 0
                try:
                    leg_body = self.with_priority(json.dumps(plan.body).encode(), info, e,
                                                  routed.seat)
                    resp, first = await self.forwarder.open_stream(e, plan.path, leg_body,
                                                                   leg_headers)
                    self.core.first_byte(routed)
                    splice = Splice(st, is_chat, plan.as_completion)
                    ending, num_events, leg_reason = await self.forwarder.relay(
                        out, resp, first, functools.partial(_spliced, splice, ledger, strip_ids),
                        self.forwarder.counts_of(e))
                except BackendFailure as exc:
                    if exc.kind == REFUSED:  # never the endpoint's fault; nobody would take it
                        return await self._give_up(
                            out, "failed", f"{reason}; the continuation was refused: {exc}")
                    tried.add(e.name)
                    self.feedback.failure(e, exc.kind, time.monotonic())
                    self.metrics.retries.inc()
                    continue
                finally:
                    self._leg_done(e, routed, info, ending, num_events)
                if ending == DONE:
                    self.metrics.migrations.labels("continued").inc()
                    await self.forwarder.end(out)
                    return out
                if ending == CLIENT_GONE:
                    return out
                tried.add(e.name)
                reason = leg_reason
                break
            else:  # every attempt failed before its first byte
                return await self._give_up(out, "failed",
                                           f"{reason}; no endpoint took the continuation")
        return await self._give_up(out, "exhausted", reason)

    async def _give_up(self, out: web.StreamResponse, outcome: str,
                       message: str) -> web.StreamResponse:
        """The stream ends with one error event; `outcome` is why (migrations_total)."""
        self.metrics.migrations.labels(outcome).inc()
        await self.forwarder.end_broken(out, message)
        return out

    def _leg_done(self, e: EndpointState, routed: Routed, info: RequestInfo, ending: str,
                  num_events: int) -> None:
        """A continuation leg ended: the endpoint's health (no latency learning: its
        prompt is not the request's), the tenant charged only what the leg generated,
        and its seat given back."""
        now = time.monotonic()
        if ending == DONE:
            self.feedback.success(e)
        elif ending != CLIENT_GONE:
            self.feedback.failure(e, "midstream", now)
        self.gate.charge(info.tenant, min(num_events, info.max_tokens)
                         - self._dispatch_charge(info), now)
        self.end(routed)


def _with_return_token_ids(body: bytes) -> bytes:
    """The body asking for token ids (a JSON object: the key goes before its last brace;
    a `false` the client sent earlier in it loses, as JSON's last key wins)."""
    end = body.rstrip()
    return end[:-1] + b',"return_token_ids":true}' if end.endswith(b"}") else body


def _spliced(splice: Splice, ledger: StreamLedger, strip_ids: bool, data: bytes) -> bytes:
    events = splice.feed(data)
    if events:
        ledger.record(events)
    return strip_token_ids(events) if strip_ids else events


async def _write_all(out: web.StreamResponse, data: bytes) -> None:
    try:
        await out.write(data)
    except (ConnectionError, RuntimeError):
        pass


def _is_gone(request: web.Request) -> bool:
    """The client closed its connection (aiohttp drops the transport; it does not cancel
    the handler unless asked to)."""
    transport = request.transport
    return transport is None or transport.is_closing()
