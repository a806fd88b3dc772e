"""Settings that are valid but probably not meant, pure: one line each, for a warning.

Meaningless settings are rejected by the parser (SpecError); these merely look odd, so
`kvfleet up` prints them and goes on.
"""

from __future__ import annotations

from .spec import PoolSpec

ODD_STABILIZATION_RATIO = 100  # scale-down stabilization this many drain timeouts long


def odd_settings(spec: PoolSpec) -> list[str]:
    out = []
    a = spec.autoscaling
    window = a.scale_down.stabilization_window_seconds
    if window > ODD_STABILIZATION_RATIO * a.drain_timeout_seconds:
        out.append(
            f"autoscaling.scaleDown.stabilizationWindowSeconds ({window}) is over "
            f"{ODD_STABILIZATION_RATIO}x drainTimeoutSeconds ({a.drain_timeout_seconds}): "
            "scale-down will lag load by that long, while a drain cuts requests off quickly"
        )
    return out
