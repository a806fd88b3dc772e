"""The router config the pool wants, as the dict `kvfleet_router.config.RouterConfig.from_dict`
accepts, pure.

Public API:

- `RouterEndpoint`: one replica the router should know (name, url, role, state).
- `build_router_config(spec, endpoints, version) -> dict`. With scale to zero, the router
  holds a request for `COLD_START_HOLD_S` (a cold start), not its default queue timeout.
  With `routing.kvSharing.enabled` on builtin engines, every endpoint is marked
  `engine: builtin` and the router's `kv_sharing` section carries the margin (peer hints,
  kvfleet_router/peer_hint.py); vLLM pools share KV through LMCache, not the router.
  With `routing.flowControl`, the router's `flow_control` (tenants, bands, weights, the
  tenant header, band bounds), `quotas` (only when some tenant has a limit) and `queue`
  (the TTL, which wins over the cold-start hold, and the total bound) come from the pool;
  vLLM endpoints are marked `engine: vllm` so the router forwards a band as `priority`
  only to engines started with `--scheduling-policy priority`.
- `router_exchange(spec, peers_dns) -> dict | None` (in `build_router_config` as its
  `peers_dns` keyword): the router replicas' state exchange. On with `peers_dns` (the
  runtime's name of every router pod: the Kubernetes headless Service `<pool>-router-peers`)
  when the pool runs more than one router process (`router_process.router_processes`:
  replicas x workers, plus the gateway's pickers), so they route as one router would. Off
  without `peers_dns` (a local fleet runs one router; its workers exchange among themselves
  whatever the config says) and with `placement: sidecar` (a router in every engine pod:
  all-to-all pushes would grow with the square of the fleet; a sidecar's own workers still
  share).
- `next_version(previous, candidate) -> int`: the version only moves when the content
  (everything but `version`) changes, so a steady pool never re-pushes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.decide.router_process import router_processes

# The router learns prefix locality by hashing prompt text; precise KV-event indexing is
# opt-in per endpoint and needs kvfleet engines, so the default stays approximate.
COLD_START_HOLD_S = 60.0  # how long the router holds a request for a pool scaled to zero


@dataclass(slots=True, frozen=True)
class RouterEndpoint:
    name: str
    url: str
    role: str
    is_draining: bool = False
    revision: str = ""  # the engine template it runs ("" unknown: the router's default)


def is_router_kv_sharing(spec: PoolSpec) -> bool:
    """The router steers peer prefix fetches: kvSharing on builtin engines."""
    return spec.routing.kv_sharing.enabled and spec.engine.is_builtin


def capacity(spec: PoolSpec) -> int:
    """In-flight requests the router lets one endpoint hold: its batch plus as many queued,
    so the engine's own queue (vllm:num_requests_waiting) stays visible to autoscalers."""
    return 2 * spec.engine.max_num_seqs


def build_router_config(
    spec: PoolSpec, endpoints: Sequence[RouterEndpoint], version: int,
    weights: dict[str, int] | None = None, *, peers_dns: str = "",
) -> dict[str, Any]:
    r = spec.routing
    policy: dict[str, Any] = {
        "name": r.policy,
        "imbalance": {
            "abs_threshold": float(r.imbalance.abs_threshold),
            "rel_threshold": float(r.imbalance.rel_threshold),
        },
        "min_prefix_match": float(r.min_prefix_match),
    }
    if (w := r.effective_weights()) is not None:
        policy["weights"] = w
    if (w := r.effective_prefill_weights()) is not None:
        policy["prefill_weights"] = w
    if r.pipeline is not None:  # routing.policy is "pipeline": the router's policy name too
        policy["pipelines"] = {r.policy: r.pipeline.router_pipeline()}
    # The pool's latency targets are the predictive `slo` policy's too (a request's own
    # x-kvfleet-slo-* headers still win): one SLO for the autoscaler and the router.
    targets = spec.autoscaling.targets
    slo = {k: float(v) for k, v in (("ttft_s", targets.ttft_p90_seconds),
                                    ("tpot_s", targets.itl_p90_seconds)) if v is not None}
    if slo:
        policy["slo"] = slo
    config: dict[str, Any] = {
        "version": version,
        "endpoints": [
            {
                "name": ep.name,
                "url": ep.url,
                "role": ep.role,
                "state": "draining" if ep.is_draining else "active",
                "capacity": capacity(spec),
                "models": [spec.model.api_name],
                "prefix_mode": r.prefix_mode,
                **({"revision": ep.revision} if ep.revision else {}),
            }
            for ep in sorted(endpoints, key=lambda e: e.name)
        ],
        "policy": policy,
        "session": {"header": r.session_header},
        "migration": {"enabled": r.migration.enabled,
                      "max_migrations": r.migration.max_migrations},
    }
    if weights is not None:  # a rollout splits new requests between revisions
        config["revisions"] = {"weights": dict(sorted(weights.items()))}
    if is_router_kv_sharing(spec):
        for ep in config["endpoints"]:
            ep["engine"] = "builtin"
        config["kv_sharing"] = {"enabled": True, "margin": float(r.kv_sharing.margin)}
    if spec.topology.is_disaggregated:
        config["pd"] = {"prefill_threshold_tokens": r.pd_threshold_tokens}
    queue: dict[str, Any] = {}
    if spec.autoscaling.scale_to_zero.enabled:
        queue["timeout_s"] = COLD_START_HOLD_S
    if (fc := r.flow_control) is not None:
        config["flow_control"] = fc.router_flow_control()
        if not spec.engine.is_builtin:  # the router forwards the band as `priority`
            config["flow_control"]["forward_priority_to_vllm"] = is_vllm_priority(spec)
            for ep in config["endpoints"]:
                ep.setdefault("engine", "vllm")
        if (quotas := fc.router_quotas()) is not None:
            config["quotas"] = quotas
        if fc.queue_ttl_seconds is not None:
            queue["timeout_s"] = float(fc.queue_ttl_seconds)
        if fc.max_queued is not None:
            queue["max_size"] = fc.max_queued
    if queue:
        config["queue"] = queue
    if r.text_tokenizer_path and r.prefix_mode == "precise":  # only precise endpoints use it
        config["prefix"] = {"tokenizer": {"path": r.text_tokenizer_path}}
    if (exchange := router_exchange(spec, peers_dns)) is not None:
        config["exchange"] = exchange
    return config


def router_exchange(spec: PoolSpec, peers_dns: str) -> dict[str, Any] | None:
    """The router config's `exchange` section, or None (the router's default: off)."""
    if not peers_dns or spec.routing.placement == "sidecar" or router_processes(spec) < 2:
        return None
    # The router's other exchange settings (interval, staleness, warm start) keep their
    # defaults: they are the router's to tune, not the pool's.
    return {"enabled": True, "peers_dns": peers_dns}


def is_vllm_priority(spec: PoolSpec) -> bool:
    """The pool's vLLM engines schedule by priority (`--scheduling-policy priority` in
    engine.args); without it vLLM refuses a request that carries a non-zero priority."""
    args = list(spec.engine.args)
    for i, arg in enumerate(args):
        if arg == "--scheduling-policy=priority" or (
                arg == "--scheduling-policy" and args[i + 1:i + 2] == ["priority"]):
            return True
    return False


def next_version(previous: dict[str, Any] | None, candidate: dict[str, Any]) -> int:
    """Previous version if the content is unchanged, else previous + 1 (first push: 1)."""
    if previous is None:
        return 1
    old_version = int(previous.get("version", 0))
    strip = lambda d: {k: v for k, v in d.items() if k != "version"}  # noqa: E731
    return old_version if strip(previous) == strip(candidate) else old_version + 1
