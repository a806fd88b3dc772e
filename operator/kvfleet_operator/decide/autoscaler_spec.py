"""InferencePool `spec.autoscaling` + topology -> `AutoscalerConfig`, pure.

The pool's targets are pool-wide; each role tracks the ones that describe its work:
- unified: waiting, running (concurrency), KV usage, TTFT and ITL, and uncached prompt
  tokens/s against the learned prefill capacity;
- prefill: waiting, TTFT, uncached prompt tokens/s against the learned capacity;
- decode: waiting, running, KV usage, ITL.

When the pool sets `ttftP90Seconds` and/or `itlP90Seconds`, each role also gets its SLO
(`slo_sizing.role_slo`: unified both, prefill TTFT, decode ITL; a target the pool leaves
unset is the router's default SLO) and the SLO drives its count; the per-replica targets
above then only cap (autoscaler.py, `slo_caps`). The perf-model seed per role comes from
`prefillTokensPerSecondPerReplica` when set (prefill seconds per token), else the
router's SLO priors (`slo_sizing.seed_coefficients`).
"""

from __future__ import annotations

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.decide.autoscaler import AutoscalerConfig, RoleLimits, RoleTargets
from kvfleet_operator.decide.slo_sizing import role_slo, seed_coefficients

# Per-replica uncached prefill tokens/s before anything is learned (the spec's
# prefillTokensPerSecondPerReplica overrides it). Deliberately optimistic (an 8B model on
# one H100 class GPU): capacity is learned only from saturated replicas, so a high guess
# corrects itself at the first queue, while a low one would over-provision for ever.
PREFILL_TOKENS_PER_S_DEFAULT = 20000.0
PREFILL_UTILIZATION = 0.8  # headroom so TTFT does not queue at the learned capacity


def role_targets(spec: PoolSpec, role: str) -> RoleTargets:
    t = spec.autoscaling.targets
    prefill_util = PREFILL_UTILIZATION if role != "decode" else None
    return RoleTargets(
        num_waiting=t.waiting_per_replica,
        num_running=t.running_per_replica if role != "prefill" else None,
        kv_usage=t.kv_cache_usage if role != "prefill" else None,
        prefill_utilization=prefill_util,
        ttft_p90_s=t.ttft_p90_seconds if role != "decode" else None,
        itl_p90_s=t.itl_p90_seconds if role != "prefill" else None,
        slo=role_slo(role, t.ttft_p90_seconds, t.itl_p90_seconds),
    )


def config_from_pool(spec: PoolSpec) -> AutoscalerConfig:
    a = spec.autoscaling
    roles = spec.topology.roles()
    return AutoscalerConfig(
        roles={name: RoleLimits(r.replicas.min, r.replicas.max) for name, r in roles.items()},
        targets={name: role_targets(spec, name) for name in roles},
        is_enabled=a.enabled,
        stable_window_s=float(a.window_seconds),
        panic_window_s=float(a.panic.window_seconds),
        panic_threshold=a.panic.threshold,
        scale_up_window_s=float(a.scale_up.stabilization_window_seconds),
        scale_down_window_s=float(a.scale_down.stabilization_window_seconds),
        scale_up_cooldown_s=float(a.scale_up.cooldown_seconds),
        scale_down_cooldown_s=float(a.scale_down.cooldown_seconds),
        max_step_up=a.scale_up.max_step,
        max_step_down=a.scale_down.max_step,
        scale_to_zero_after_s=float(a.scale_to_zero.idle_seconds),
        prefill_tokens_per_s_initial=(
            a.targets.prefill_tokens_per_second_per_replica or PREFILL_TOKENS_PER_S_DEFAULT
        ),
        perf_seed={
            name: seed_coefficients(a.targets.prefill_tokens_per_second_per_replica)
            for name in roles
        },
    )
