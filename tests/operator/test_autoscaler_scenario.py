"""Scenario: the autoscaler over a synthetic load curve, in virtual time (no sleeps).

A fluid queue stands in for the fleet: requests arrive at rate lambda(t), each ready replica
completes `mu` per second, new replicas take `startup_s` to become ready. Each replica's
/metrics-like sample goes through the real ScrapeLog + aggregate, then `decide`.
"""

from dataclasses import dataclass

import pytest
from kvfleet_operator.api.status import Reason
from kvfleet_operator.decide.autoscaler import (
    AutoscalerConfig,
    History,
    RoleLimits,
    RoleTargets,
    decide,
)
from kvfleet_operator.decide.role_signals import ReplicaSample, Scrape, ScrapeLog, aggregate

MU = 2.0  # requests/s one replica completes
STARTUP_S = 4.0
INTERVAL_S = 2.0


@dataclass
class Run:
    times: list[float]
    desired: list[int]
    ready: list[int]
    limited: list[str | None]
    reasons: list[str]


def simulate(load, duration_s, config: AutoscalerConfig, dt=0.5) -> Run:
    role = "unified"
    replicas: dict[str, float] = {"r0": -100.0}  # name -> start time
    counters: dict[str, float] = {"r0": 0.0}
    next_id, backlog, history = 1, 0.0, History()
    log = ScrapeLog()
    run = Run([], [], [], [], [])
    t, next_decision = 0.0, 0.0
    while t < duration_s:
        ready = [n for n, s in replicas.items() if t - s >= STARTUP_S]
        backlog += load(t) * dt
        served = min(backlog, MU * len(ready) * dt)
        backlog -= served
        for name in replicas:
            if name in ready:
                counters[name] += served / len(ready)
                sample = ReplicaSample(
                    num_waiting=backlog / len(ready),
                    num_running=min(MU, served / dt / len(ready)),
                    ttft=((float("inf"), counters[name]),),
                )
                log.add(name, Scrape(t, sample))
        if t >= next_decision:
            next_decision += INTERVAL_S
            roles = {n: role for n in ready}
            stable = aggregate(log, roles, t, config.stable_window_s, stale_after_s=2.0)
            panic = aggregate(log, roles, t, config.panic_window_s, stale_after_s=2.0)
            d = decide(stable, panic, {role: len(replicas)}, config, history, now=t)
            history = d.history
            want = d.desired[role]
            while len(replicas) < want:
                replicas[f"r{next_id}"], counters[f"r{next_id}"] = t, 0.0
                next_id += 1
            while len(replicas) > want:  # newest first (scaledown's tie-break)
                victim = max(replicas, key=lambda n: replicas[n])
                del replicas[victim]
                log.forget(victim)
            log.prune(t, config.stable_window_s + 5)
            run.times.append(t)
            run.desired.append(want)
            run.ready.append(len(ready))
            run.limited.append(d.limited[role])
            run.reasons.append(d.reasons[role])
        t += dt
    return run


def config(**kw):
    base = dict(
        roles={"unified": RoleLimits(1, 6)},
        targets={"unified": RoleTargets(num_waiting=2.0, num_running=MU)},
        stable_window_s=20.0,
        panic_window_s=4.0,
        scale_up_window_s=0.0,
        scale_down_window_s=40.0,
        scale_up_cooldown_s=4.0,
        scale_down_cooldown_s=10.0,
        max_step_up=4,
        max_step_down=1,
    )
    base.update(kw)
    return AutoscalerConfig(**base)


def step_load(t):
    return 1.0 if t < 60 else 9.0 if t < 180 else 1.0


def at(run, t0, t1):
    return [d for t, d in zip(run.times, run.desired, strict=True) if t0 <= t < t1]


def test_step_load_scales_up_fast_without_flapping_and_back_down():
    run = simulate(step_load, 400.0, config())
    assert max(at(run, 0, 60)) == 1  # light load: one replica is enough
    # 9 req/s needs 5 replicas at 2 req/s each; it must get there within 16 s.
    first_enough = next(
        t for t, d in zip(run.times, run.desired, strict=True) if t >= 60 and d >= 5
    )
    assert first_enough - 60 <= 16, run.reasons
    # Steady high load, once the startup backlog is served: one level, no oscillation.
    plateau = at(run, 150, 180)
    assert len(set(plateau)) == 1 and plateau[0] >= 5
    # Directions over the whole run: up moves, then down moves, never up again.
    moves = [b - a for a, b in zip(run.desired, run.desired[1:], strict=False) if b != a]
    signs = [m > 0 for m in moves]
    assert signs == sorted(signs, reverse=True), moves
    # No scale-down inside the stabilization window after load drops...
    assert min(at(run, 180, 180 + 40)) >= plateau[0] - 1
    # ...and one step at a time after it, back to the minimum by the end.
    assert all(abs(m) == 1 for m in moves if m < 0)
    assert run.desired[-1] == 1


def test_spike_beyond_max_is_clamped_and_reported():
    run = simulate(lambda t: 40.0 if 20 <= t < 80 else 0.5, 120.0, config())
    assert max(run.desired) == 6
    assert Reason.AT_MAX_REPLICAS in run.limited
    assert all(1 <= d <= 6 for d in run.desired)


def test_panic_reacts_within_one_interval_of_a_burst():
    # A long stabilization window would hold scale-up back; the panic window bypasses it.
    run = simulate(step_load, 120.0, config(scale_up_window_s=60.0))
    after = [
        (t, d, r)
        for t, d, r in zip(run.times, run.desired, run.reasons, strict=True)
        if t >= 60 and d > 1
    ]
    assert after and after[0][0] - 60 <= 8 and "panic" in after[0][2], after[:3]


@pytest.mark.parametrize("max_step_up", [1, 2])
def test_step_limits_bound_every_decision(max_step_up):
    run = simulate(step_load, 140.0, config(max_step_up=max_step_up, scale_up_cooldown_s=0.0))
    moves = [b - a for a, b in zip(run.desired, run.desired[1:], strict=False)]
    assert max(moves) == max_step_up
    assert Reason.STEP_LIMITED in run.limited
