"""The soak's report, pure: outcomes and fault records in, figures out.

Each failed request is charged to one fault: the one whose window (injected, until the fleet
was back at full capacity plus `grace_s`) holds the moment the request failed; else the last
fault whose window overlaps the request's life; else `none` (a failure no fault explains).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from kvfleet_bench.chaos.load import Outcome


@dataclass(slots=True)
class FaultRecord:
    index: int
    kind: str
    target: str
    scheduled_s: float
    injected_s: float
    cleared_s: float  # the cause removed (SIGCONT, proxy back to pass); = injected if instant
    recovered_s: float | None  # full capacity again; None: not within the limit
    in_flight_on_victim: int = 0  # router_kill: requests open on that router at the kill
    num_engine_processes: int | None = None  # loop_kill: engines running once recovered
    detail: str = ""

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_s is None else self.recovered_s - self.injected_s

    @property
    def recovery_after_clear_s(self) -> float | None:
        return None if self.recovered_s is None else self.recovered_s - self.cleared_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "recovery_s": self.recovery_s}


def attribute(outcomes: list[Outcome], faults: list[FaultRecord],
              grace_s: float = 2.0) -> dict[int, str]:
    """Request index -> the fault kind charged with its failure (`none` if no fault)."""
    windows = [(f.injected_s, (f.recovered_s if f.recovered_s is not None else float("inf"))
                + grace_s, f.kind) for f in faults]
    out = {}
    for o in outcomes:
        if o.is_ok:
            continue
        holding = [w for w in windows if w[0] <= o.end_s <= w[1]]
        if not holding:
            holding = [w for w in windows if w[0] <= o.end_s and w[1] >= o.start_s]
        out[o.index] = max(holding)[2] if holding else "none"
    return out


def _dist(values: list[float]) -> dict[str, float | int] | None:
    if not values:
        return None
    return {"n": len(values), "p50": round(statistics.median(values), 2),
            "max": round(max(values), 2)}


def summarize(outcomes: list[Outcome], faults: list[FaultRecord],
              migrations: dict[str, float], grace_s: float = 2.0) -> dict[str, Any]:
    charged = attribute(outcomes, faults, grace_s)
    failed = [o for o in outcomes if not o.is_ok]
    by_kind: dict[str, Counter[str]] = {}
    for o in failed:
        by_kind.setdefault(charged[o.index], Counter())[o.outcome] += 1
    kinds = sorted({f.kind for f in faults})
    recovery = {k: _dist([f.recovery_s for f in faults if f.kind == k
                          and f.recovery_s is not None]) for k in kinds}
    after_clear = {k: _dist([f.recovery_after_clear_s for f in faults if f.kind == k
                             and f.recovery_after_clear_s is not None]) for k in kinds}
    per_header = [o.migrated for o in outcomes if o.migrated is not None]
    router_kills = [f for f in faults if f.kind == "router_kill"]
    return {
        "num_sent": len(outcomes),
        "num_ok": len(outcomes) - len(failed),
        "num_failed": len(failed),
        "failed_by_cause": dict(Counter(o.outcome for o in failed).most_common()),
        "failed_by_fault": {k: dict(c.most_common()) for k, c in sorted(by_kind.items())},
        "faults_by_kind": dict(Counter(f.kind for f in faults).most_common()),
        "num_faults": len(faults),
        "num_not_recovered": sum(f.recovered_s is None for f in faults),
        "recovery_s": _dist([f.recovery_s for f in faults if f.recovery_s is not None]),
        "recovery_s_by_kind": recovery,
        "recovery_after_clear_s_by_kind": after_clear,  # from SIGCONT, proxy back, restart
        "migrations": {k: int(v) for k, v in sorted(migrations.items())},
        "num_migrated_requests": (sum(1 for m in per_header if m > 0) if per_header else None),
        "router_kill_in_flight": sum(f.in_flight_on_victim for f in router_kills),
        "router_kill_failed": sum(by_kind.get("router_kill", Counter()).values()),
        "by_shape": {shape: {"sent": n, "failed": sum(1 for o in failed if o.shape == shape)}
                     for shape, n in Counter(o.shape for o in outcomes).items()},
    }
