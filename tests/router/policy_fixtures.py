"""Builders for pure policy tests: endpoints with chosen counters, no I/O."""

from __future__ import annotations

import random

from kvfleet_router.config import EndpointConfig, RouterConfig
from kvfleet_router.endpoint import EndpointState, Signals
from kvfleet_router.policies.context import RouteContext
from kvfleet_router.request_info import RequestInfo


def ep(name: str, *, in_flight: int = 0, kv: float | None = None, waiting: float = 0,
       running: float = 0, role: str = "unified", capacity: int = 256,
       models: tuple[str, ...] = (), draining: bool = False) -> EndpointState:
    e = EndpointState.from_config(EndpointConfig(name=name, url=f"http://{name}:1", role=role,
                                                 capacity=capacity, models=list(models),
                                                 state="draining" if draining else "active"))
    e.num_in_flight = in_flight
    if kv is not None:
        e.apply_scrape(Signals(num_running=running, num_waiting=waiting, kv_usage=kv,
                               scraped_at=1.0))
        e.is_signals_fresh = True
    return e


def ctx(**kw: object) -> RouteContext:
    info = kw.pop("request", None) or RequestInfo()
    return RouteContext(request=info, rng=random.Random(0), **kw)  # type: ignore[arg-type]


def cfg(**policy: object) -> RouterConfig:
    return RouterConfig.from_dict({"policy": policy} if policy else {})
