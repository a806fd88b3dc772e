"""kvfleet_router_flow_fairness{band}: Jain's index over the band's backlogged tenants of
attained service per weight, computed at scrape time from the fair queue's own counter;
and the queue length the operator reads as held demand counts every flow-control band.
"""

from __future__ import annotations

import asyncio

import pytest
from kvfleet_engine.contract import parse_text
from kvfleet_operator.runtimes.router_control import QUEUE_METRIC, get_queue_length
from kvfleet_router.config import FlowControlConfig, RouterConfig
from kvfleet_router.metrics import RouterMetrics, fairness, jain_index
from kvfleet_router.router_core import RouterCore
from kvfleet_router.wait_queue import WaitQueue


def test_jain_index_at_its_bounds():
    assert jain_index([]) == jain_index([5.0]) == jain_index([0.0, 0.0]) == 1.0
    assert jain_index([2.0, 2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)  # 1/n: one got all
    assert jain_index([1.0, 3.0]) == pytest.approx(16 / 20)


def _queue_with(served: dict[str, float], weights: dict[str, float], bands=None):
    """A wait queue (clock frozen at 0) with one queued request per tenant, after each
    tenant was served `served[t]` tokens, queued in `served`'s order (a tenant that joins
    a backlog below the least backlogged one's level is lifted to it: VTC)."""
    bands = bands or {}
    queue = WaitQueue(100, FlowControlConfig(), clock=lambda: 0.0)
    for tenant, tokens in served.items():
        queue.charge(tenant, tokens)

    async def fill():
        for tenant in served:
            queue.enter(tenant=tenant, weight=weights.get(tenant, 1.0),
                        band=bands.get(tenant, 0))
    asyncio.run(fill())
    return queue


def _scrape(queue: WaitQueue) -> dict[tuple[str, tuple], float]:
    core = RouterCore(RouterConfig())
    text = RouterMetrics(lambda: core, lambda: len(queue), clock=lambda: 0.0,
                         band_lengths=queue.band_lengths,
                         fairness=lambda: fairness(queue)).render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for s in parse_text(text).samples}


def test_served_in_proportion_to_weight_is_fair():
    """Weights 1, 1, 2, 4 served 100, 100, 200, 400 tokens: exactly their shares."""
    weights = {"a": 1, "b": 1, "c": 2, "d": 4}
    queue = _queue_with({t: 100.0 * w for t, w in weights.items()}, weights)
    samples = _scrape(queue)
    assert samples[("kvfleet_router_flow_fairness", (("band", "standard"),))] == \
        pytest.approx(1.0)


def test_one_tenant_taking_everything_scores_one_over_n():
    queue = _queue_with({"a": 0.0, "b": 0.0, "c": 0.0, "flood": 10_000.0}, {})
    samples = _scrape(queue)
    assert samples[("kvfleet_router_flow_fairness", (("band", "standard"),))] == \
        pytest.approx(0.25)


def test_each_band_is_judged_on_its_own_by_service_per_weight():
    """Equal tokens to tenants of weights 1 and 3 is unfair (0.8) in the sheddable band;
    the critical band's lone tenant is trivially fair."""
    queue = _queue_with({"y": 300.0, "x": 300.0, "vip": 50.0}, {"x": 1, "y": 3},
                        bands={"x": 1, "y": 1, "vip": -1})
    fair = fairness(queue)
    assert fair[1] == pytest.approx(jain_index([300.0, 100.0])) == pytest.approx(0.8)
    assert fair[-1] == 1.0


class _Response:
    def __init__(self, text: str) -> None:
        self.status, self._text = 200, text

    async def text(self) -> str:
        return self._text

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


class _Session:
    def __init__(self, text: str) -> None:
        self._text = text

    def get(self, url: str) -> _Response:
        return _Response(self._text)


def test_the_operators_held_demand_counts_every_flow_control_band():
    """Requests flow control queues in any band are the held requests the autoscaler
    counts (role_signals.num_held_requests, read from kvfleet_router_queue_length)."""
    queue = _queue_with({"vip": 0.0, "a": 0.0, "b": 0.0, "bulk": 0.0}, {},
                        bands={"vip": -1, "bulk": 1, "b": 7})
    core = RouterCore(RouterConfig())
    text = RouterMetrics(lambda: core, lambda: len(queue), band_lengths=queue.band_lengths,
                         fairness=lambda: fairness(queue)).render().decode()
    held = asyncio.run(get_queue_length(_Session(text), "http://router"))  # type: ignore[arg-type]
    assert held == 4 == sum(queue.band_lengths().values())
    assert QUEUE_METRIC == "kvfleet_router_queue_length"
