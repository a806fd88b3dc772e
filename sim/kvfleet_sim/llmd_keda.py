"""llm-d's token-aware KEDA rule, the simulator's `llmd-keda` baseline. Pure, time injected.

Source: llm-d/llm-d `guides/workload-autoscaling/keda-epp-token-aware/` (README and the
`optimized-baseline` and `pd-disaggregation` ScaledObjects; llm-d.ai "[Experimental]
Token-Aware Autoscaling"). Two KEDA Prometheus triggers, `metricType: AverageValue`, so the
HPA asks ceil(value / threshold) replicas for each and takes the larger:

* prefill: sum(llm_d_epp_inflight_tokens) / V_P, the uncached prompt tokens dispatched but
  not yet prefilled, in *seconds* of prefill backlog; threshold = seconds of backlog
  tolerated per replica, "a share of your TTFT budget": TTFT_SLO - ISL_uncached / V_P (the
  idle floor), shaved to 60-70 % for a p90 SLO. Here: 0.65 x (TTFT SLO - CHUNK / V_P), the
  middle of that range, with the calibration prompt (CHUNK tokens) as the ISL. Backlog =
  the engines' queued uncached prompt tokens (`RoleSignals.num_waiting_prompt_tokens`, the
  same quantity, read at the engine rather than the EPP), extrapolated from known replicas.
* decode: sum(vllm:kv_cache_usage_perc) against 0.8 ("pods' worth of full KV cache").
* unified pool (the guide's P+D co-located ScaledObject): both triggers, the max wins;
  prefill role: the prefill trigger; decode role: the KV trigger.

V_P (`peakPrefillThroughput`) is calibrated as llm-d's `calibrate.sh` does: CHUNK_SIZE /
median(TTFT) of sequential CHUNK_SIZE-token prompts on an idle replica, CHUNK_SIZE being
the engine's maxNumBatchedTokens; here the pool's engine runs them offline
(`engine_sweep.py`).

HPA behaviour, from the pool's `autoscaling` (as waiting-5 takes it, so only the rule
differs): the HPA's 10 % tolerance (no change while value / (threshold x current) is within
[0.9, 1.1]); a trigger whose metric is unknown cannot scale down (the HPA's rule for a failed
metric); stabilization windows (up: the window's lowest recommendation, down: its highest);
at most `maxStep` replicas per decision and no second move within the cooldowns (an HPA
`Pods` policy with periodSeconds = the cooldown); min/max clamps. Scale to zero (min 0):
after `scaleToZero.idleSeconds` with both triggers at 0 and the role idle (KEDA's
cooldownPeriod), and back to 1 on the first held request (activation threshold 0).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache

from kvfleet_engine.runners.cost_model import load_profile
from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.decide.autoscaler import (
    LIMIT_MAX,
    LIMIT_MIN,
    LIMIT_STEP_DOWN,
    LIMIT_STEP_UP,
    Decision,
    History,
    RoleLimits,
    decision_reason,
)
from kvfleet_operator.decide.role_signals import RoleSignals, Signals

from kvfleet_sim.dynamo_planner import DEFAULT_TTFT_SLO_S
from kvfleet_sim.engine_sweep import engine_config_for, profile_name, run_batch

TTFT_SHARE = 0.65  # the guide: shave the formula's threshold to 60-70 % for a p90 SLO
KV_THRESHOLD = 0.8  # the guide's decode threshold
HPA_TOLERANCE = 0.1  # kube-controller-manager --horizontal-pod-autoscaler-tolerance
NUM_CALIBRATION_REQUESTS = 3


@lru_cache(maxsize=8)
def _calibrate(profile: str, spec_key: tuple[int, int, int, int, int]) -> float:
    from kvfleet_engine.core.config import EngineConfig

    num_blocks, block_size, max_num_seqs, chunk, max_model_len = spec_key
    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=chunk, max_model_len=max_model_len,
                          enable_prefix_caching=False)  # fmt: skip
    prompt = min(chunk, max_model_len - 1)
    ttfts = [run_batch(config, profile, prompt, 1, 1)[0][0]
             for _ in range(NUM_CALIBRATION_REQUESTS)]  # fmt: skip
    return prompt / statistics.median(ttfts)


def calibrate_peak_prefill(spec: PoolSpec) -> float:
    """V_P: CHUNK_SIZE / median TTFT of CHUNK_SIZE-token prompts on an idle replica."""
    name = profile_name(spec)
    c = engine_config_for(spec, load_profile(name).num_gpu_blocks)
    return _calibrate(name, (c.num_blocks, c.block_size, c.max_num_seqs,
                             c.max_num_batched_tokens, c.max_model_len))  # fmt: skip


@dataclass(frozen=True, slots=True)
class LlmdKedaConfig:
    roles: dict[str, RoleLimits]
    peak_prefill_tokens_per_s: float  # V_P
    backlog_threshold_s: float  # seconds of prefill backlog per replica
    kv_threshold: float = KV_THRESHOLD
    tolerance: float = HPA_TOLERANCE
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    max_step_up: int = 4
    max_step_down: int = 1
    scale_up_cooldown_s: float = 0.0
    scale_down_cooldown_s: float = 0.0
    scale_to_zero_after_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.peak_prefill_tokens_per_s > 0 or not self.backlog_threshold_s > 0:
            raise ValueError("need peak_prefill_tokens_per_s > 0 and backlog_threshold_s > 0 "
                             "(the TTFT SLO is below the idle prefill floor)")  # fmt: skip
        if not 0 < self.kv_threshold or not 0 <= self.tolerance < 1:
            raise ValueError("need kv_threshold > 0 and tolerance in [0, 1)")
        if self.max_step_up < 1 or self.max_step_down < 1:
            raise ValueError("max steps must be >= 1")

    @classmethod
    def from_pool(cls, spec: PoolSpec) -> LlmdKedaConfig:
        a = spec.autoscaling
        v_p = calibrate_peak_prefill(spec)
        ttft = a.targets.ttft_p90_seconds or DEFAULT_TTFT_SLO_S
        floor = spec.engine.max_num_batched_tokens / v_p  # the calibration prompt, idle
        return cls(
            roles={n: RoleLimits(r.replicas.min, r.replicas.max)
                   for n, r in spec.topology.roles().items()},
            peak_prefill_tokens_per_s=v_p,
            backlog_threshold_s=TTFT_SHARE * (ttft - floor),
            scale_up_window_s=float(a.scale_up.stabilization_window_seconds),
            scale_down_window_s=float(a.scale_down.stabilization_window_seconds),
            max_step_up=a.scale_up.max_step,
            max_step_down=a.scale_down.max_step,
            scale_up_cooldown_s=float(a.scale_up.cooldown_seconds),
            scale_down_cooldown_s=float(a.scale_down.cooldown_seconds),
            scale_to_zero_after_s=float(a.scale_to_zero.idle_seconds),
        )  # fmt: skip


def hpa_replicas(value: float, threshold: float, current: int, tolerance: float) -> int:
    """The HPA's AverageValue rule for one external metric: ceil(value / threshold), unless
    the usage ratio value / (threshold x current) is within the tolerance of 1."""
    if current > 0 and abs(value / (threshold * current) - 1.0) <= tolerance + 1e-9:
        return current
    return math.ceil(value / threshold - 1e-9)


def triggers(rs: RoleSignals, role: str, config: LlmdKedaConfig
             ) -> list[tuple[str, float | None, float]]:  # fmt: skip
    """(name, metric value or None when unknown, threshold) of the role's triggers."""
    scale = rs.num_replicas / rs.num_known if rs.num_known else 0.0
    out: list[tuple[str, float | None, float]] = []
    if role != "decode":
        backlog = rs.num_waiting_prompt_tokens
        seconds = None if backlog is None else backlog * scale / config.peak_prefill_tokens_per_s
        out.append(("prefill backlog s", seconds, config.backlog_threshold_s))
    if role != "prefill":
        out.append(("kv pods", rs.kv_usage_mean * rs.num_known * scale, config.kv_threshold))
    return out


def _role(role: str, rs: RoleSignals, current: int, config: LlmdKedaConfig, hist: History,
          now: float) -> tuple[int, str, str | None]:  # fmt: skip
    limits = config.roles[role]
    wants: list[tuple[int, str]] = []
    is_unknown = rs.num_unknown > 0
    for name, value, threshold in triggers(rs, role, config):
        if value is None:
            is_unknown = True
            continue
        n = hpa_replicas(value, threshold, current, config.tolerance)
        wants.append((n, f"{name} {value:.2f} / {threshold:.2f} -> {n}"))
    raw, why = max(wants, default=(current, "no metric"))
    why = "; ".join(w for _, w in wants) or why
    is_zero = all(n == 0 for n, _ in wants) and rs.is_idle
    if is_zero and current > 0:
        hist.idle_since.setdefault(role, now)
    else:
        hist.idle_since.pop(role, None)
    if current == 0:
        if rs.num_held_requests or raw > 0:
            n = min(max(1, raw, limits.min_replicas), limits.max_replicas)
            return n, f"activate: {why}", None
        return 0, "idle at zero", None
    floor = max(limits.min_replicas, 1)
    rec = max(raw, floor)
    recs = [(t, n) for t, n in hist.recommendations.get(role, [])
            if t >= now - max(config.scale_up_window_s, config.scale_down_window_s)]  # fmt: skip
    recs.append((now, rec))
    hist.recommendations[role] = recs
    target = rec
    if rec > current:
        window = [n for t, n in recs if t >= now - config.scale_up_window_s]
        target = max(current, min(window))
    elif rec < current:
        window = [n for t, n in recs if t >= now - config.scale_down_window_s]
        target = min(current, max(window))
    if target < current and is_unknown:
        target, why = current, f"hold: a metric is unknown ({why})"
    idle_for = now - hist.idle_since.get(role, now)
    if limits.min_replicas == 0 and role in hist.idle_since and \
            idle_for >= config.scale_to_zero_after_s:  # fmt: skip
        target, why = 0, f"both triggers 0 for {idle_for:.0f}s (to zero)"
    limited: str | None = None
    if target > current + config.max_step_up:
        target, limited = current + config.max_step_up, LIMIT_STEP_UP
    elif target < current - config.max_step_down and target > 0:
        target, limited = current - config.max_step_down, LIMIT_STEP_DOWN
    if target > limits.max_replicas:
        target, limited = limits.max_replicas, LIMIT_MAX
    elif target < limits.min_replicas:
        target, limited = limits.min_replicas, LIMIT_MIN
    up = hist.last_scale_up.get(role, -math.inf)
    last = max(up, hist.last_scale_down.get(role, -math.inf))
    if target > current and now - up < config.scale_up_cooldown_s:
        target, why = current, f"hold: scale-up period ({why})"
    elif target < current and now - last < config.scale_down_cooldown_s:
        target, why = current, f"hold: scale-down period ({why})"
    if target > current:
        hist.last_scale_up[role] = now
    elif target < current:
        hist.last_scale_down[role] = now
    return target, why, limited


def llmd_keda_decide(stable: Signals, panic: Signals, current: dict[str, int],
                     config: LlmdKedaConfig, history: History, now: float) -> Decision:  # fmt: skip
    """One decision for every role, on the stable window (the HPA reads one metric value;
    the panic window is not used). Pure: returns a new History."""
    hist = History.from_dict(history.to_dict())
    desired: dict[str, int] = {}
    reasons: dict[str, str] = {}
    limited: dict[str, str | None] = {}
    kinds: dict[str, str] = {}
    for role in config.roles:
        n = current.get(role, 0)
        rs = stable.roles.get(role, RoleSignals())
        target, why, lim = _role(role, rs, n, config, hist, now)
        verb = "scale up" if target > n else "scale down" if target < n else "steady"
        desired[role], limited[role] = target, lim
        on = (f"kvfleet:num_waiting_prompt_tokens / V_P {config.peak_prefill_tokens_per_s:.0f};"
              " vllm:kv_cache_usage_perc")
        reasons[role] = f"{verb} {n}->{target}: {why} [on: {on}]"
        kinds[role] = decision_reason(n, target, is_panic=False)
    return Decision(desired, reasons, limited, hist, kinds)
