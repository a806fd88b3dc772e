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
    c.saturation.max_waiting = 1  # the smallest limit: one waiting request is saturated
    assert names(FILTERS["saturation"](c)([ep("a", kv=0.1, waiting=1), ep("b", kv=0.1)],
                                          ctx())) == ["b"]


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


def loaded(name, q, capacity=256):
    """An endpoint whose queue depth is q: the engine's running requests beyond this
    router's none (foreign load, fractional as a scrape's average is)."""
    return ep(name, kv=0.1, running=q, capacity=capacity)


@pytest.mark.parametrize("depths, load_factor, kept", [
    # Two endpoints are enough to bound: share = 1.25 x 4 / 2 = 2.5, cap ceil = 3.
    ([3, 0], 1.25, ["b"]),
    ([2, 1], 1.25, ["a", "b"]),     # a: 2 + 1 = 3 <= 3, exactly at the cap, stays
    # An integral share is its own cap: 1.0 x 4 / 2 = 2: a at 1 + 1 stays, b at 2 + 1 not.
    ([1, 2], 1.0, ["a"]),
    # None under the cap (0.875 rounds up to 1 < 1.25): the least loaded alone.
    ([0.25, 0.5], 1.0, ["a"]),
    ([0.5, 0.25], 1.0, ["b"]),
])
def test_bounded_load_keeps_those_at_or_under_the_cap(depths, load_factor, kept):
    eps = [loaded(n, q) for n, q in zip("ab", depths, strict=True)]
    f = FILTERS["bounded-load"](cfg(load_factor=load_factor))
    assert names(f(eps, ctx())) == kept


def test_bounded_load_share_follows_capacity():
    # Capacities 64 and 192: the share of 1.25 x (2 + 1) = 3.75 is 0.94 and 2.81 -> caps
    # 1 and 3: the small endpoint with 1 request is over, the large one with 1 is under.
    eps = [loaded("small", 1, capacity=64), loaded("large", 1, capacity=192)]
    assert names(FILTERS["bounded-load"](cfg(load_factor=1.25))(eps, ctx())) == ["large"]
    # None under its cap: the least loaded relative to its capacity, not in requests.
    eps = [loaded("one", 0.25, capacity=1), loaded("two", 0.25, capacity=2)]
    assert names(FILTERS["bounded-load"](cfg(load_factor=1.0))(eps, ctx())) == ["two"]


def test_saturation_does_not_count_the_seats_a_request_outranks():
    # capacity 4: "full" has 4 in flight, 1 of them a seat this request outranks (the
    # engine preempts it), so 3 count and it stays; "fuller" has 5 with 1 outranked: 4
    # count, at capacity, dropped. With any seat outranked the engine's own signals
    # (waiting, KV) do not drop an endpoint: it preempts for the request.
    c = RouterConfig.from_dict({"saturation": {"max_waiting": 2, "max_kv_usage": 0.9}})
    full, fuller = ep("full", in_flight=4, capacity=4), ep("fuller", in_flight=5, capacity=4)
    busy = ep("busy", in_flight=1, capacity=4, kv=0.95, waiting=3)
    keep = FILTERS["saturation"](c)
    outranked = {"full": 1, "fuller": 1, "busy": 1}
    assert names(keep([full, fuller, busy], ctx(outranked=outranked))) == ["full", "busy"]
    # An endpoint where it outranks nothing is judged as without flow control.
    calm = ep("calm", in_flight=1, capacity=4, kv=0.1)
    assert names(keep([full, fuller, busy, calm], ctx(outranked={"full": 1}))) == [
        "full", "calm"]
    assert names(keep([full, fuller, busy], ctx())) == []
