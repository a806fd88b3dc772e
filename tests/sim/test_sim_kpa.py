"""The Knative-KPA-style baseline: concurrency over stable and panic windows, pure."""

from pathlib import Path

from kvfleet_operator.api import load_pool
from kvfleet_operator.api.status import DecisionReason, Reason
from kvfleet_operator.decide.autoscaler import History, RoleLimits
from kvfleet_operator.decide.role_signals import RoleSignals, Signals
from kvfleet_sim.fleet import FleetSim, SimSettings
from kvfleet_sim.kpa import KPAConfig, concurrency, kpa_decide
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceRequest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = KPAConfig(roles={"unified": RoleLimits(1, 20)}, target=10.0, stable_window_s=60.0)


def signals(running: float, ready: int, waiting: float = 0.0, held: int = 0,
            role: str = "unified") -> Signals:  # fmt: skip
    rs = RoleSignals(num_replicas=ready, num_known=ready, num_running=running,
                     num_waiting=waiting, num_held_requests=held)  # fmt: skip
    return Signals(0.0, 1.0, {role: rs})


def test_stable_desired_is_ceil_of_concurrency_over_target():
    d = kpa_decide(signals(25, 2, waiting=6), signals(30, 2), {"unified": 2}, CONFIG,
                   History(), 0.0)  # fmt: skip
    assert d.desired == {"unified": 4}  # ceil(31 / 10); panic 3.0 < 2 x 2 ready
    assert d.reasons["unified"].startswith("scale up 2->4: concurrency 31.0") and d.is_changed
    assert d.kinds["unified"] == DecisionReason.SCALING_UP and not d.history.panic_until


def test_panic_scales_on_the_short_window_and_never_down_until_a_quiet_stable_window():
    history = History()
    # The burst: panic-window desired 4.5 >= 2 x 2 ready, while the stable window says 2.
    d = kpa_decide(signals(15, 2), signals(45, 2), {"unified": 2}, CONFIG, history, 100.0)
    assert d.desired == {"unified": 5} and d.kinds["unified"] == DecisionReason.PANIC_SCALE_UP
    assert history.panic_until == {}  # the input is not mutated
    # The burst is over, both windows are low: in panic the count holds ...
    low = signals(5, 5), signals(5, 5)
    d = kpa_decide(*low, {"unified": 5}, CONFIG, d.history, 130.0)
    assert d.desired == {"unified": 5} and d.reasons["unified"].startswith("steady 5->5: panic")
    # ... until a stable window has passed without the condition; then down at rate 2.
    d = kpa_decide(*low, {"unified": 5}, CONFIG, d.history, 161.0)
    assert d.desired == {"unified": 2} and not d.history.panic_until
    assert d.kinds["unified"] == DecisionReason.SCALING_DOWN


def test_scale_down_is_rate_limited_and_clamped_to_min_and_max():
    wide = KPAConfig(roles={"unified": RoleLimits(2, 10)}, target=10.0, stable_window_s=60.0)
    d = kpa_decide(signals(0, 8), signals(0, 8), {"unified": 8}, wide, History(), 0.0)
    assert d.desired == {"unified": 4} and d.limited["unified"] is None  # 8 / 2, not 0
    config = KPAConfig(roles={"unified": RoleLimits(3, 6)}, target=10.0, stable_window_s=60.0)
    d = kpa_decide(signals(0, 4), signals(0, 4), {"unified": 4}, config, History(), 0.0)
    assert d.desired == {"unified": 3} and d.limited["unified"] == Reason.AT_MIN_REPLICAS
    d = kpa_decide(signals(500, 4), signals(500, 4), {"unified": 4}, config, History(), 0.0)
    assert d.desired == {"unified": 6} and d.limited["unified"] == Reason.AT_MAX_REPLICAS


def test_min_zero_goes_to_zero_when_idle_and_held_requests_activate():
    config = KPAConfig(roles={"unified": RoleLimits(0, 4)}, target=10.0, stable_window_s=60.0)
    d = kpa_decide(signals(0, 1), signals(0, 1), {"unified": 1}, config, History(), 0.0)
    assert d.desired == {"unified": 0}
    d = kpa_decide(signals(0, 1), signals(0.2, 1), {"unified": 1}, config, History(), 0.0)
    assert d.desired == {"unified": 1}  # a little work never rounds to zero
    held = signals(0, 0, held=3)
    d = kpa_decide(held, held, {"unified": 0}, config, History(), 0.0)
    assert d.desired == {"unified": 1} and d.kinds["unified"] == DecisionReason.ACTIVATED_FROM_ZERO


def test_each_pd_role_is_scaled_on_its_own_concurrency():
    config = KPAConfig(roles={"prefill": RoleLimits(1, 10), "decode": RoleLimits(1, 10)},
                       target=10.0, stable_window_s=60.0)  # fmt: skip
    rs = {"prefill": RoleSignals(num_replicas=2, num_known=2, num_running=8, num_waiting=2),
          "decode": RoleSignals(num_replicas=2, num_known=2, num_running=52)}  # fmt: skip
    sig = Signals(0.0, 1.0, rs)
    d = kpa_decide(sig, sig, {"prefill": 2, "decode": 2}, config, History(), 0.0)
    assert d.desired == {"prefill": 1, "decode": 6}


def test_unknown_replicas_are_extrapolated_from_known_ones():
    rs = RoleSignals(num_replicas=4, num_known=2, num_running=20, num_held_requests=1)
    assert concurrency(rs) == 41.0


def test_from_pool_targets_seventy_percent_of_max_num_seqs():
    pool = load_pool(str(ROOT / "sim" / "pools" / "h100-llama3-8b-pd.yaml"))
    config = KPAConfig.from_pool(pool.spec)
    assert config.target == 128 * 0.7 and config.stable_window_s == 20.0
    assert config.roles == {"prefill": RoleLimits(1, 6), "decode": RoleLimits(2, 10)}


def test_kpa_runs_in_the_fleet_and_scales_up_on_a_burst():
    pool = load_pool(str(ROOT / "examples" / "local-sim.yaml"))  # 1..6 replicas
    pool.spec.engine.max_num_seqs = 8  # target 5.6 per replica, so 40 requests need more
    trace = [TraceRequest(t=2.0 + i * 0.05, num_prompt_tokens=300, num_output_tokens=400)
             for i in range(40)]  # fmt: skip
    result = FleetSim(pool, SCALERS["kpa"](pool.spec), SimSettings(startup_s=2.0)).run(trace)
    assert len(result.finished) == 40 and not any(f.is_aborted for f in result.finished)
    assert max(p for _, p, _ in result.timeline) > 1
    assert any("panic" in why for _, why in result.reasons)
