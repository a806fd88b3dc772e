import random

import pytest
from kvfleet_router.policies.guard import imbalance_ratio, is_imbalanced
from kvfleet_router.policies.pickers import PICKERS


def test_max_picks_argmax_and_breaks_ties_randomly():
    rng = random.Random(1)
    pick = PICKERS["max"]()
    assert pick([0.1, 0.9, 0.3], rng) == 1
    assert {pick([0.5, 0.5, 0.1], rng) for _ in range(50)} == {0, 1}


def test_power_of_two_never_picks_the_worst_of_three():
    rng = random.Random(2)
    pick = PICKERS["power-of-two"]()
    picks = [pick([0.0, 0.5, 1.0], rng) for _ in range(200)]
    assert 0 not in picks and {1, 2} <= set(picks)
    assert pick([0.3], rng) == 0


def test_weighted_random_follows_weights():
    rng = random.Random(3)
    pick = PICKERS["weighted-random"]()
    picks = [pick([0.0, 1.0, 3.0], rng) for _ in range(4000)]
    assert picks.count(0) == 0
    assert picks.count(2) / picks.count(1) == pytest.approx(3.0, rel=0.15)
    assert {pick([0.0, 0.0], rng) for _ in range(50)} == {0, 1}


def test_weighted_random_follows_weights_that_sum_below_one():
    rng = random.Random(4)
    picks = [PICKERS["weighted-random"]()([0.0, 0.1, 0.3], rng) for _ in range(4000)]
    assert picks.count(0) == 0
    assert picks.count(2) / picks.count(1) == pytest.approx(3.0, rel=0.15)


def test_round_robin_cycles():
    pick = PICKERS["round-robin"]()
    assert [pick([0, 0, 0], random.Random()) for _ in range(5)] == [0, 1, 2, 0, 1]


@pytest.mark.parametrize("loads, abs_t, rel_t, expected", [
    ([0, 10], 8, 1.5, True),      # 10 > 8 and 10 > 0
    ([5, 10], 8, 1.5, False),     # spread 5 <= 8
    ([10, 19], 8, 1.5, True),     # 9 > 8 and 19 > 15
    ([20, 29], 8, 1.5, False),    # 29 <= 30
    ([0, 8], 8, 1.5, False),      # spread exactly the absolute threshold: balanced
    ([0, 8.5], 8, 1.5, True),     # just over it
    ([18, 27], 8, 1.5, False),    # spread 9 > 8, but 27 is exactly 1.5 x 18: balanced
    ([18, 27.5], 8, 1.5, True),   # just over both
    ([3], 0, 1.0, False),
    ([], 0, 1.0, False),
])
def test_imbalance_guard(loads, abs_t, rel_t, expected):
    assert is_imbalanced(loads, abs_t, rel_t) is expected


def test_imbalance_ratio():
    assert imbalance_ratio([0.5, 0.25, 0.75]) == pytest.approx((0.75 - 0.25) / 0.5)
    assert imbalance_ratio([0, 0]) == 0.0
    assert imbalance_ratio([1.0]) == 0.0
    assert imbalance_ratio([1.0, 3.0]) == pytest.approx(1.0)  # two endpoints are a fleet
