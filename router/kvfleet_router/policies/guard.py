"""The sgl-router-style load-imbalance guard used by `cache-aware`.

The load is imbalanced when  max(q) - min(q) > abs_threshold  AND  max(q) > rel_threshold * min(q),
with q the queue depth (in-flight) of each candidate. Then cache affinity yields to load
balancing, so affinity never builds a hotspot.
"""

from __future__ import annotations

from collections.abc import Sequence


def is_imbalanced(loads: Sequence[float], abs_threshold: float, rel_threshold: float) -> bool:
    if len(loads) < 2:
        return False
    hi, lo = max(loads), min(loads)
    return hi - lo > abs_threshold and hi > rel_threshold * lo


def imbalance_ratio(loads: Sequence[float]) -> float:
    """(max - min) / mean, the fleet metric; 0 when idle or with fewer than two."""
    if len(loads) < 2:
        return 0.0
    mean = sum(loads) / len(loads)
    return 0.0 if mean <= 0 else (max(loads) - min(loads)) / mean
