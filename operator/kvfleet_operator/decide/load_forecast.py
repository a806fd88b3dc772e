"""Load forecast over the pool's start-up time, and the start-up time measured from the
fleet: pure, time injected.

A replica asked for now serves only after it starts (tens of seconds to minutes for vLLM
on GPUs), so the SLO sizing (`slo_sizing.py`) checks the ITL target at the load expected
one start-up time ahead, not the load of now. (The TTFT target is checked at the load of
now: a burst that outruns the start-up waits in the queue, within the TTFT budget;
`autoscaler.slo_demand` says why.)

* Forecast: an ordinary least-squares line through the role's recent request rates (one
  point per decision, the stable window's mean rate, placed at the window's middle),
  evaluated at now + start-up. Why a line and not Holt's double exponential smoothing or
  a seasonal model: the horizon (10 s to a few minutes) is far shorter than any daily or
  weekly season, so a seasonal term has nothing to learn within it; over a window as
  short as the stable window, a least-squares slope is what Holt's trend converges to,
  without two smoothing constants to tune per trace. The line only raises the load: the
  forecast is max(observed, line), so a falling trend never scales down ahead of time
  (scale-down has its own stabilization window), and growth is capped at
  `MAX_GROWTH` x the observed rate, so a noisy slope over a long start-up cannot ask for
  an unbounded fleet. Flat traffic stays flat; fewer than `MIN_POINTS` points: no trend.
* Start-up time: when a role is scaled up from c to d at time t, (t, d) is remembered;
  the first decision that sees d replicas measured (ready) records now - t, the time from
  asking to serving (scheduling, image pull, model load and readiness included, to the
  decision interval). The role's start-up time is an EWMA (`STARTUP_ALPHA`) of those
  samples, `startup_s_initial` before the first. A scale-down below d forgets the ask.

`ForecastState` holds both per role and lives in the autoscaler's `History`
(`to_dict` / `from_dict`), so a restarted operator keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MIN_POINTS = 3
MAX_GROWTH = 2.0  # the forecast is at most this multiple of the observed rate
STARTUP_ALPHA = 0.5  # EWMA weight of a new start-up sample


def linear_forecast(points: Sequence[tuple[float, float]], observed: float, at: float,
                    max_growth: float = MAX_GROWTH) -> float:
    """max(observed, the least-squares line through `points` (t, value) at time `at`),
    at most `max_growth` x observed; `observed` when there are fewer than MIN_POINTS points
    or they span no time."""
    if len(points) < MIN_POINTS:
        return observed
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var <= 0:
        return observed
    slope = sum((t - mt) * (v - mv) for t, v in points) / var
    line = mv + slope * (at - mt)
    if not math.isfinite(line):
        return observed
    return max(observed, min(line, observed * max_growth))


@dataclass(slots=True)
class ForecastState:
    """Per role: recent (t, rate) points, the start-up time learned, scale-ups not yet
    served ((t asked, replicas asked for))."""

    rates: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    startup_s: dict[str, float] = field(default_factory=dict)
    pending_up: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rates": {r: [list(p) for p in v] for r, v in self.rates.items()},
            "startup_s": dict(self.startup_s),
            "pending_up": {r: [list(p) for p in v] for r, v in self.pending_up.items()},
        }

    @classmethod
    def from_dict(cls, data: Any) -> ForecastState:
        """Rebuild from `to_dict`; None or {} is a fresh state; raises ValueError otherwise."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError("forecast state must be an object")
        try:
            return cls(
                {str(r): [(float(t), float(v)) for t, v in ps]
                 for r, ps in (data.get("rates") or {}).items()},
                {str(r): float(v) for r, v in (data.get("startup_s") or {}).items()},
                {str(r): [(float(t), int(n)) for t, n in ps]
                 for r, ps in (data.get("pending_up") or {}).items()},
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed forecast state: {exc}") from None


def _last_window(state: ForecastState, role: str, now: float, window_s: float
                 ) -> list[tuple[float, float]]:
    """The points of the last window's decisions: each sits half a window before its
    decision, so those newer than now - 1.5 windows."""
    return [(t, v) for t, v in state.rates.get(role, []) if t > now - 1.5 * window_s]


def record_rate(state: ForecastState, role: str, now: float, rate: float, window_s: float
                ) -> None:
    """Remember the stable window's mean rate at the window's middle; keep one window."""
    state.rates[role] = [*_last_window(state, role, now, window_s), (now - window_s / 2, rate)]


def recent_peak_rate(state: ForecastState, role: str, now: float, window_s: float) -> float:
    """The highest stable-window rate `record_rate` kept for the decisions of the last
    window (0 when none): the load that latency measured over that window was served at."""
    return max((v for _, v in _last_window(state, role, now, window_s)), default=0.0)


def forecast_rate(state: ForecastState, role: str, now: float, observed: float,
                  horizon_s: float) -> float:
    return linear_forecast(state.rates.get(role, []), observed, now + horizon_s)


def startup_of(state: ForecastState, role: str, initial_s: float) -> float:
    return state.startup_s.get(role, initial_s)


def track_startup(state: ForecastState, role: str, now: float, current: int, target: int,
                  num_ready: int) -> None:
    """Settle earlier scale-ups that `num_ready` now serves (one start-up sample each,
    EWMA), forget those a lower `target` cancelled, and remember a new one (target >
    current)."""
    pending = state.pending_up.get(role, [])
    keep: list[tuple[float, int]] = []
    for t, asked in pending:
        if num_ready >= asked:
            sample = now - t
            old = state.startup_s.get(role)
            state.startup_s[role] = sample if old is None else (
                STARTUP_ALPHA * sample + (1 - STARTUP_ALPHA) * old)
        elif asked <= target:
            keep.append((t, asked))
    if target > current:
        keep.append((now, target))
    if keep:
        state.pending_up[role] = keep
    else:
        state.pending_up.pop(role, None)
