"""Pickers: choose one endpoint index from candidates and their combined scores.

Registered by type name in PICKERS; each factory returns a fresh picker (round-robin has
a counter).

* max:             argmax of the score; exact ties broken uniformly at random.
* power-of-two:    sample two distinct candidates uniformly, keep the higher score.
* weighted-random: P(i) = s_i / sum(s); uniform when every score is 0.
* round-robin:     i = k mod n for the k-th decision (scores ignored).
* slo-tiered:      weighted-random among the scores above 0.5, weight s_i - 0.5 (the `slo`
                   scorer's endpoints predicted to meet the SLO, by headroom); none above
                   0.5: max (the least late).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

Picker = Callable[[Sequence[float], random.Random], int]


def pick_max(scores: Sequence[float], rng: random.Random) -> int:
    best = max(scores)
    ties = [i for i, s in enumerate(scores) if s >= best - 1e-12]
    return ties[0] if len(ties) == 1 else rng.choice(ties)


def pick_power_of_two(scores: Sequence[float], rng: random.Random) -> int:
    if len(scores) == 1:
        return 0
    a, b = rng.sample(range(len(scores)), 2)
    return a if scores[a] >= scores[b] else b


def pick_weighted_random(scores: Sequence[float], rng: random.Random) -> int:
    total = sum(scores)
    if total <= 0:
        return rng.randrange(len(scores))
    x = rng.random() * total
    for i, s in enumerate(scores):
        x -= s
        if x < 0:
            return i
    return len(scores) - 1


def pick_slo_tiered(scores: Sequence[float], rng: random.Random) -> int:
    above = [(i, s - 0.5) for i, s in enumerate(scores) if s > 0.5]
    if not above:
        return pick_max(scores, rng)
    j = pick_weighted_random([w for _, w in above], rng)
    return above[j][0]


class RoundRobin:
    def __init__(self) -> None:
        self.num_decisions = 0

    def __call__(self, scores: Sequence[float], rng: random.Random) -> int:
        i = self.num_decisions % len(scores)
        self.num_decisions += 1
        return i


PICKERS: dict[str, Callable[[], Picker]] = {
    "max": lambda: pick_max,
    "power-of-two": lambda: pick_power_of_two,
    "weighted-random": lambda: pick_weighted_random,
    "round-robin": RoundRobin,
    "slo-tiered": lambda: pick_slo_tiered,
}
