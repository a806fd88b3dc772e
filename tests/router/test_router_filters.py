import pytest
from kvfleet_router.config import RouterConfig
from kvfleet_router.policies.filters import FILTERS, is_saturated
from kvfleet_router.request_info import RequestInfo
from policy_fixtures import cfg, ctx, ep


def names(eps):
    return [e.name for e in eps]


def ejected(name):
    e = ep(name)
    for _ in range(3):
        e.breaker.record_failure(now=0.0)
    return e


def probe_down(name):
    e = ep(name)
    e.is_probe_healthy = False
    return e


def self_draining(name, fresh=True):
    e = ep(name, kv=0.1)
    e.signals.is_draining = True
    e.is_signals_fresh = fresh
    return e


@pytest.mark.parametrize("filter_name, endpoints, context, kept", [
    ("not-draining", [self_draining("a"), self_draining("b", fresh=False), ep("c")], {},
     ["b", "c"]),
    ("healthy", [ep("a"), ejected("b"), probe_down("c")], {"now": 0.5}, ["a"]),
    ("healthy", [ejected("b")], {"now": 100.0}, ["b"]),  # half-open: one trial allowed
    ("not-draining", [ep("a"), ep("b", draining=True)], {}, ["a"]),
    ("role", [ep("a", role="prefill"), ep("b", role="decode"), ep("c")], {"role": "decode"},
     ["b"]),
    ("model", [ep("a", models=("m1",)), ep("b", models=("m2",)), ep("c")],
     {"request": RequestInfo(model="m2")}, ["b", "c"]),
    ("model", [ep("a", models=("m1",))], {"request": RequestInfo(model=None)}, ["a"]),
    ("saturation", [ep("a", in_flight=4, capacity=4), ep("b", in_flight=3, capacity=4)], {},
     ["b"]),
    ("saturation", [ep("a", kv=0.99), ep("b", kv=0.5), ep("c")], {}, ["b", "c"]),
])
def test_filter_table(filter_name, endpoints, context, kept):
    assert names(FILTERS[filter_name](cfg())(endpoints, ctx(**context))) == kept


def test_saturation_on_waiting_only_when_enabled_and_fresh():
    c = cfg()
    c.saturation.max_waiting = 5
    stale = ep("c", kv=0.1, waiting=50)
    stale.is_signals_fresh = False  # unknown: not proof of saturation
    eps = [ep("a", kv=0.1, waiting=5), ep("b", kv=0.1, waiting=4), stale]
    assert names(FILTERS["saturation"](c)(eps, ctx())) == ["b", "c"]


@pytest.mark.parametrize("max_kv_usage", [1.0, 0.98])
def test_saturation_kv_boundary_drops_a_full_endpoint(max_kv_usage):
    """KV usage at the limit is saturated (so with max_kv_usage 1.0 a full endpoint is
    dropped); just below it is kept; a stale scrape proves nothing."""
    c = RouterConfig.from_dict({"saturation": {"max_kv_usage": max_kv_usage}})
    stale = ep("stale", kv=1.0)
    stale.is_signals_fresh = False
    eps = [ep("at", kv=max_kv_usage), ep("below", kv=max_kv_usage - 1e-6),
           ep("over", kv=max_kv_usage + 0.01), stale]
    assert names(FILTERS["saturation"](c)(eps, ctx())) == ["below", "stale"]
    assert [is_saturated(e, 0, max_kv_usage) for e in eps] == [True, False, True, False]
