"""scaledown: victim order and drain completion."""

import pytest
from kvfleet_operator.decide.scaledown import VictimCandidate as V
from kvfleet_operator.decide.scaledown import choose_victims, is_drain_done


@pytest.mark.parametrize(
    "candidates,num,expected",
    [
        ([V("a", num_in_flight=3), V("b", num_in_flight=1), V("c", num_in_flight=2)], 1, ["b"]),
        (
            [V("a", num_in_flight=3), V("b", num_in_flight=1), V("c", num_in_flight=2)],
            2,
            ["b", "c"],
        ),
        # Not ready first, whatever its numbers.
        ([V("a"), V("b", is_ready=False, num_in_flight=9)], 1, ["b"]),
        # Of those not ready, one stuck (failed, overdue) before one still starting,
        # whatever their ages; among the starting, the newest.
        ([V("starting", is_ready=False, started_at=1.0),
          V("stuck", is_ready=False, is_stuck=True, started_at=5.0)], 1, ["stuck"]),
        ([V("starting", is_ready=False, started_at=5.0),
          V("stuck", is_ready=False, is_stuck=True, started_at=1.0)], 1, ["stuck"]),
        ([V("old", is_ready=False, started_at=1.0), V("new", is_ready=False, started_at=5.0)],
         1, ["new"]),
        # Tie on requests: the colder prefix cache (fewer hit tokens/s) goes first.
        (
            [
                V("a", num_in_flight=1, prefix_hit_tokens_per_s=50),
                V("b", num_in_flight=1, prefix_hit_tokens_per_s=10),
            ],
            1,
            ["b"],
        ),
        ([V("a", num_in_flight=0, prefix_hit_tokens_per_s=0), V("b", num_in_flight=1)], 1, ["a"]),
        # Full tie: the newest goes (coldest cache), then by name.
        ([V("old", started_at=1.0), V("new", started_at=5.0)], 1, ["new"]),
        ([V("y"), V("x")], 1, ["x"]),
        ([V("a"), V("b")], 5, ["a", "b"]),
        ([V("a")], 0, []),
    ],
)
def test_choose_victims(candidates, num, expected):
    assert choose_victims(candidates, num) == expected


def test_bad_input():
    with pytest.raises(ValueError, match="unique"):
        choose_victims([V("a"), V("a")], 1)
    with pytest.raises(ValueError, match=">= 0"):
        choose_victims([V("a")], -1)
    with pytest.raises(ValueError, match="a:"):
        V("a", num_in_flight=-1)


@pytest.mark.parametrize(
    "in_flight,started,now,timeout,done",
    [
        (0, 0.0, 0.0, 30.0, True),
        (1, 0.0, 29.9, 30.0, False),  # one request still in flight: not done
        (2, 0.0, 10.0, 30.0, False),
        (2, 0.0, 30.0, 30.0, True),  # at the timeout exactly
        (2, 100.0, 129.9, 30.0, False),  # the timeout counts from the drain's start
        (2, 100.0, 130.0, 30.0, True),
    ],
)
def test_is_drain_done(in_flight, started, now, timeout, done):
    assert is_drain_done(in_flight, started, now, timeout) is done
