"""Filters: drop endpoints a request must not go to. Registered by type name in FILTERS.

Each factory takes the RouterConfig and returns `f(endpoints, ctx) -> endpoints`.

* healthy:      keep e if its last /health probe passed and its circuit breaker admits a try.
* not-draining: keep e if e.state is active and a fresh scrape does not show the engine
                draining itself (kvfleet:draining); draining endpoints finish in-flight work.
* role:         keep e if e.role == ctx.role (unified, prefill or decode).
* model:        keep e if e.models is empty or ctx.request.model is None or in e.models.
* saturation:   drop e if in_flight >= capacity, or engine waiting >= max_waiting (when > 0,
                fresh scrape only), or KV usage >= max_kv_usage (fresh scrape only; at the
                limit is saturated, so even max_kv_usage 1.0 drops a full endpoint). Seats
                the request outranks (ctx.outranked, flow/seats.py) are not counted, and
                with any the engine's signals do not drop e: it preempts one for it.
* bounded-load: consistent hashing with bounded loads, capacity-relative: keep e if
                q_e + 1 <= ceil(load_factor * (Q + 1) * capacity_e / C), q = queue depth
                (in-flight + foreign load), Q and C their sums over the candidates; none
                kept: the least loaded (q / capacity). What the learned and scraped
                policies (latency, ucb, slo, least-kv) choose among, so no score can
                send one endpoint more than load_factor x its fair share (+1 request).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kvfleet_router.breaker import CLOSED
from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.policies.context import RouteContext

Filter = Callable[[list[EndpointState], RouteContext], list[EndpointState]]

# Filters run over every endpoint for every request (a thousand in the simulator and in
# large pools), so the common cases are tested inline before any method call.


def healthy(cfg: RouterConfig) -> Filter:
    def keep(eps: list[EndpointState], ctx: RouteContext) -> list[EndpointState]:
        now = ctx.now
        return [e for e in eps if e.is_probe_healthy
                and (e.breaker.state == CLOSED or e.breaker.can_attempt(now))]  # fmt: skip

    return keep


def not_draining(cfg: RouterConfig) -> Filter:
    return lambda eps, ctx: [e for e in eps if e.is_accepting()]


def role(cfg: RouterConfig) -> Filter:
    return lambda eps, ctx: [e for e in eps if e.role == ctx.role]


def model(cfg: RouterConfig) -> Filter:
    def keep(eps: list[EndpointState], ctx: RouteContext) -> list[EndpointState]:
        wanted = ctx.request.model
        if wanted is None:
            return eps
        return [e for e in eps if not e.models or wanted in e.models]

    return keep


def is_saturated(e: EndpointState, max_waiting: int, max_kv_usage: float) -> bool:
    if e.in_flight_total >= e.capacity:
        return True
    if not e.is_signals_fresh:
        return False  # unknown is not proof of saturation; the in-flight cap still holds
    if max_waiting > 0 and e.signals.num_waiting >= max_waiting:
        return True
    return e.signals.kv_usage >= max_kv_usage


def _is_full_outranking(e: EndpointState, outranked: int, max_waiting: int,
                        max_kv_usage: float) -> bool:
    if not outranked:
        return e.in_flight_total >= e.capacity or (
            e.is_signals_fresh and is_saturated(e, max_waiting, max_kv_usage))
    return e.in_flight_total - outranked >= e.capacity


def saturation(cfg: RouterConfig) -> Filter:
    max_waiting, max_kv = cfg.saturation.max_waiting, cfg.saturation.max_kv_usage

    def keep(eps: list[EndpointState], ctx: RouteContext) -> list[EndpointState]:
        outranked = ctx.outranked
        if outranked:
            return [e for e in eps if not _is_full_outranking(e, outranked.get(e.name, 0),
                                                              max_waiting, max_kv)]
        return [e for e in eps if not (e.in_flight_total >= e.capacity or (
            e.is_signals_fresh and is_saturated(e, max_waiting, max_kv)))]  # fmt: skip

    return keep


def bounded_load(cfg: RouterConfig) -> Filter:
    factor = cfg.policy.load_factor

    def keep(eps: list[EndpointState], ctx: RouteContext) -> list[EndpointState]:
        if len(eps) < 2:
            return eps
        depths = [e.queue_depth() for e in eps]
        total_cap = sum(e.capacity for e in eps)
        share = factor * (sum(depths) + 1) / total_cap
        kept = [e for e, q in zip(eps, depths, strict=True)
                if q + 1 <= math.ceil(share * e.capacity - 1e-9)]
        if kept:
            return kept
        i = min(range(len(eps)), key=lambda k: depths[k] / eps[k].capacity)
        return [eps[i]]

    return keep


FILTERS: dict[str, Callable[[RouterConfig], Filter]] = {
    "healthy": healthy,
    "not-draining": not_draining,
    "role": role,
    "model": model,
    "saturation": saturation,
    "bounded-load": bounded_load,
}

# Eligibility first; an empty result after "saturation" alone means "queue, then 429".
ELIGIBILITY = ("healthy", "not-draining", "role", "model")
