"""Flow control's queue order, pure (flow/fair_queue.py): bands first, weighted least
attained service over tokens between the tenants of a band, (priority, deadline, arrival)
inside a tenant."""

from __future__ import annotations

import random

import pytest
from kvfleet_router.flow.fair_queue import FairQueue, QueueFull, Ticket
from kvfleet_router.flow.service import AttainedService


def _queue(max_size: int = 100_000, window_s: float = 3600.0, **kw: object) -> FairQueue:
    return FairQueue(max_size, AttainedService(window_s), **kw)  # type: ignore[arg-type]


def _push(q: FairQueue, tenant: str, now: float = 0.0, **kw: object) -> Ticket:
    t = Ticket(tenant=tenant, seq=q.next_seq(), enqueued_at=now, **kw)  # type: ignore[arg-type]
    q.push(t, now)
    return t


def _serve(q: FairQueue, cost: dict[str, int] | None, n: int, refill: bool,
           rng: random.Random | None = None) -> dict[str, float]:
    """Dispatch `n` heads, charging each one's tokens (fixed per tenant, or drawn from 10 to
    1,000); with `refill` each served tenant queues another (stays backlogged)."""
    served: dict[str, float] = {}
    for i in range(n):
        now = i * 0.01
        t = q.head(now)
        assert t is not None
        q.remove(t)
        tokens = cost[t.tenant] if cost else rng.randint(10, 1000)  # type: ignore[union-attr]
        q.service.charge(t.tenant, tokens, now)
        served[t.tenant] = served.get(t.tenant, 0) + tokens
        if refill:
            _push(q, t.tenant, now, weight=t.weight, band=t.band)
    return served


def test_a_flooding_tenant_gets_half_not_more():
    q = _queue()
    for _ in range(1000):
        _push(q, "flood")
    for _ in range(5):
        _push(q, "quiet")
    # quiet keeps five waiting (refilled as served); flood has 1,000 queued
    served = _serve(q, {"flood": 100, "quiet": 100}, 400, refill=True)
    assert served["quiet"] == pytest.approx(served["flood"], rel=0.02)


@pytest.mark.parametrize("seed", [0, 1])
def test_weighted_shares_of_tokens_within_ten_percent(seed: int):
    weights = {"w1a": 1.0, "w1b": 1.0, "w2": 2.0, "w4": 4.0}
    q = _queue()
    for name, w in weights.items():
        for _ in range(3):
            _push(q, name, weight=w)
    served = _serve(q, None, 4000, refill=True, rng=random.Random(seed))
    total = sum(served.values())
    for name, w in weights.items():
        share, want = served[name] / total, w / sum(weights.values())
        assert abs(share - want) <= 0.10 * want, (name, share, want)
    # Jain's index between the equal-weight pair
    a, b = served["w1a"], served["w1b"]
    assert (a + b) ** 2 / (2 * (a * a + b * b)) >= 0.95


def test_a_tenant_back_from_idle_banks_no_credit():
    q = _queue()
    for _ in range(200):
        _push(q, "busy")
    _serve(q, {"busy": 100}, 100, refill=False)  # busy alone: 10,000 tokens served
    for _ in range(50):
        _push(q, "back")
    served = _serve(q, {"busy": 100, "back": 100}, 20, refill=False)
    assert served.get("busy", 0) >= 800  # shared from the start, not 20 in a row for back


def test_higher_band_first_lower_band_when_it_leaves_capacity():
    q = _queue()
    shed = [_push(q, "batch", band=1) for _ in range(3)]
    std = _push(q, "web", band=0)
    crit = _push(q, "pager", band=-1)
    assert q.head(0) is crit
    q.remove(crit)
    assert q.head(0) is std
    q.remove(std)
    assert q.head(0) is shed[0]  # the higher bands are empty: the sheddable one goes
    assert q.would_lead(0) and not q.would_lead(1)


def test_inside_a_tenant_priority_then_deadline_then_arrival():
    q = _queue()
    late = _push(q, "t", deadline=50.0)
    early = _push(q, "t", deadline=10.0)
    same = _push(q, "t", deadline=10.0)
    urgent = _push(q, "t", priority=-1, deadline=99.0)
    order = []
    while (t := q.head(0)) is not None:
        order.append(t)
        q.remove(t)
    assert order == [urgent, early, same, late]


def test_bounds_whole_queue_and_per_band():
    q = _queue(max_size=4, band_bound=lambda band: 1 if band == 1 else None)
    _push(q, "a", band=1)
    with pytest.raises(QueueFull):
        _push(q, "b", band=1)
    for _ in range(3):
        _push(q, "c")
    with pytest.raises(QueueFull):
        _push(q, "c")
    assert len(q) == 4 and q.band_lengths() == {1: 1, 0: 3}


def test_removing_an_unknown_ticket_is_a_no_op():
    q = _queue()
    t = _push(q, "a")
    assert q.remove(t) and not q.remove(t) and len(q) == 0 and q.head(0) is None
    queued = _push(q, "a", band=0)
    assert not q.remove(Ticket(tenant="b", band=0))  # its band is queued, its tenant not
    assert not q.remove(Ticket(tenant="a", band=3))  # its band is not queued
    assert not q.remove(Ticket(tenant="a", band=0))  # its tenant is, not this ticket
    assert q.remove(queued) and len(q) == 0


def test_service_decays_over_the_window():
    s = AttainedService(window_s=10.0)
    s.charge("a", 1000, 0.0)
    assert s.value("a", 10.0) == pytest.approx(1000 / 2.718281828, rel=1e-6)


def test_a_newcomer_at_the_floor_goes_before_the_tenant_at_the_floor():
    """The lift puts a newly backlogged tenant just below the band's least normalised
    service: its first request is next, not behind the flood's queued ones."""
    q = _queue(window_s=60.0)
    q.service.charge("flood", 5000, 0.0)
    for _ in range(3):
        _push(q, "flood", 0.0)
    _push(q, "quiet", 7.3)  # quiet never served: lifted to flood's (decayed) service
    head = q.head(11.9)
    assert head is not None and head.tenant == "quiet"
    assert q.service.value("quiet", 7.3) == pytest.approx(q.service.value("flood", 7.3))
    q.remove(head)
    q.service.charge("quiet", 100, 11.9)
    head = q.head(11.9)
    assert head is not None and head.tenant == "flood"  # one request ahead, no more


def test_a_newly_backlogged_tenant_starts_at_the_least_served_not_the_most():
    # heavy (1,000 tokens) and light (100) are backlogged; a newcomer is lifted to just
    # below light's service: it goes next, before light, and heavy stays last.
    q = _queue()
    _push(q, "heavy")
    _push(q, "light")
    q.service.charge("heavy", 1000, 0.0)
    q.service.charge("light", 100, 0.0)
    _push(q, "new")
    assert q.head(0.0).tenant == "new"
    assert q.service.value("new", 0.0) == pytest.approx(100.0)
    q.remove(q.head(0.0))
    assert q.head(0.0).tenant == "light"


def test_a_new_band_leads_only_below_every_queued_band():
    q = _queue()
    assert q.would_lead(5)  # an empty queue: anything leads
    _push(q, "a", band=0)
    _push(q, "b", band=2)
    assert q.would_lead(-1) and not q.would_lead(0) and not q.would_lead(1)

