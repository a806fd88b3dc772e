"""Seats and standings (flow/seats.py): a tenant clearly under its share on an endpoint
(served less than half, per weight, of the most served holder there) outranks the seats
of the others, and only the seats it outranks may be ignored by the cap."""

from __future__ import annotations

from kvfleet_router.flow.seats import Seats, standing


def _hold(seats: Seats, tenant: str, n: int, *, band: int = 0, weight: float = 1.0,
          standing_: int = 0, endpoint: str = "e") -> list:
    return [seats.take(endpoint, tenant, band, weight, standing_) for _ in range(n)]


def test_standing_doubles_the_base_and_the_share_lifts_by_one():
    assert [standing(b, False) for b in (-1, 0, 1)] == [-2, 0, 2]
    assert [standing(b, True) for b in (-1, 0, 1)] == [-3, -1, 1]
    # every lifted standing stays inside its band: below the next band's best
    assert standing(0, False) < standing(1, True) and standing(-1, False) < standing(0, True)


def _served(**tokens: float):
    return lambda tenant: tokens.get(tenant, 0.0)


def test_alone_in_its_band_a_tenant_is_never_under_its_share():
    seats = Seats()
    served = _served(a=0.0, other_band=1e6, elsewhere=1e6)
    assert not seats.is_under_share("e", "a", 0, 1.0, served)
    _hold(seats, "a", 2)
    _hold(seats, "other_band", 3, band=1)
    _hold(seats, "elsewhere", 3, endpoint="f")
    assert not seats.is_under_share("e", "a", 0, 1.0, served)


def test_under_its_share_below_half_of_the_most_served_holder_per_weight():
    seats = Seats()
    _hold(seats, "flood", 4)
    _hold(seats, "near", 1)
    assert seats.is_under_share("e", "a", 0, 1.0, _served(flood=1000, a=499))
    assert not seats.is_under_share("e", "a", 0, 1.0, _served(flood=1000, a=500))  # boundary
    assert not seats.is_under_share("e", "a", 0, 1.0, _served())  # nobody served: no one under
    # the most served holder counts, not the least: near at 100 does not hide the flood
    assert seats.is_under_share("e", "a", 0, 1.0, _served(flood=1000, near=100, a=400))
    # the flood is not under its own share, whatever it holds
    assert not seats.is_under_share("e", "flood", 0, 1.0, _served(flood=1000, near=100))
    # per unit of weight: weight 3 served 1,400 is 467 per weight, under half of 1,000
    assert seats.is_under_share("e", "w3", 0, 3.0, _served(flood=1000, w3=1400))
    assert not seats.is_under_share("e", "w3", 0, 3.0, _served(flood=1000, w3=1500))
    # and the holders' weights count too: a flood of weight 4 served 1,000 is 250 per weight
    heavy = Seats()
    _hold(heavy, "flood", 2, weight=4.0)
    assert not heavy.is_under_share("e", "a", 0, 1.0, _served(flood=1000, a=200))


def test_worse_than_counts_only_worse_standings_and_give_back_undoes_take():
    seats = Seats()
    flood = _hold(seats, "flood", 3, standing_=0)
    lifted = _hold(seats, "a", 1, standing_=-1)
    critical = _hold(seats, "pager", 1, band=-1, standing_=-2)
    assert seats.worse_than("e", -2) == 4
    assert seats.worse_than("e", -1) == 3
    assert seats.worse_than("e", 0) == 0
    assert seats.num_held("e") == 5
    for s in flood + lifted + critical:
        seats.give_back(s)
    assert seats.num_held("e") == 0 and seats.worse_than("e", -5) == 0
    assert not seats.is_under_share("e", "a", 0, 1.0, _served(flood=1e6))  # nobody holds


def test_a_tenant_holds_until_its_last_seat_is_given_back():
    # The flood holds 3 seats; each one given back leaves it a holder (so a tenant under
    # its share is still lifted) until the last, and counts exactly one seat fewer.
    seats = Seats()
    flood = _hold(seats, "flood", 3, standing_=0)
    _hold(seats, "a", 1, standing_=0)
    served = _served(flood=1e6, a=1.0)
    for left in (2, 1):
        seats.give_back(flood.pop())
        assert seats.num_held("e") == left + 1 and seats.worse_than("e", -1) == left + 1
        assert seats.is_under_share("e", "a", 0, 1.0, served)
    seats.give_back(flood.pop())
    assert seats.num_held("e") == 1
    assert not seats.is_under_share("e", "a", 0, 1.0, served)  # alone in its band now
