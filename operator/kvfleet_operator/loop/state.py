"""`LoopState`: the control loop's memory, plain JSON so a restarted loop carries on.

It holds what cannot be re-observed: the desired counts and autoscaler history, when each
drain started (a drain timer must not restart after a restart), the last router config
the routers accepted (its version keeps counting), the ScalingLimited reasons, and the
rollout's memory (the stable revision and its spec, a rollout's step and window).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvfleet_operator.decide.autoscaler import History
from kvfleet_operator.decide.rollout import RolloutState


@dataclass(slots=True)
class LoopState:
    desired: dict[str, int] = field(default_factory=dict)
    history: History = field(default_factory=History)
    drain_started: dict[str, float] = field(default_factory=dict)
    router_config: dict[str, Any] | None = None  # the last one every router accepted
    limited: dict[str, str | None] = field(default_factory=dict)
    rollout: RolloutState | None = None  # which revision is stable, and a rollout's progress

    def to_dict(self) -> dict[str, Any]:
        return {
            "desired": dict(self.desired),
            "history": self.history.to_dict(),
            "drain_started": dict(self.drain_started),
            "router_config": self.router_config,
            "limited": dict(self.limited),
            "rollout": self.rollout.to_dict() if self.rollout is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Any) -> LoopState:
        """Rebuild from `to_dict` output; raises ValueError naming what is malformed."""
        if not isinstance(data, dict):
            raise ValueError("loop state must be an object")
        try:
            desired = {str(k): int(v) for k, v in (data.get("desired") or {}).items()}
            drains = {str(k): _finite(v) for k, v in (data.get("drain_started") or {}).items()}
            limited = {str(k): None if v is None else str(v)
                       for k, v in (data.get("limited") or {}).items()}  # fmt: skip
            config = data.get("router_config")
            if config is not None and not (isinstance(config, dict) and "version" in config):
                raise ValueError("router_config must be an object with a version")
            return cls(
                desired=desired,
                history=History.from_dict(data.get("history") or {}),
                drain_started=drains,
                router_config=config,
                limited=limited,
                rollout=RolloutState.from_dict(data["rollout"]) if data.get("rollout") else None,
            )
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"malformed loop state: {exc}") from None


def _finite(value: Any) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite time: {value!r}")
    return number
