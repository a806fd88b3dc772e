"""Build kvfleet's Grafana dashboard with grafana-foundation-sdk and write it as JSON.

    .venv/bin/python observability/grafana/build_dashboard.py   # rewrites kvfleet-dashboard.json

Panels read the engines' vLLM-named series, the router's kvfleet_router_* series and the
control plane's kvfleet_pool_* series, each with a `pool` label (engines also `role`), as
the alert rules do. `tests/observability` checks the JSON is this script's output and runs
every panel's query against a real Prometheus scraping a live local fleet.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grafana_foundation_sdk.builders.dashboard import Dashboard, QueryVariable
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.timeseries import Panel
from grafana_foundation_sdk.cog.encoder import JSONEncoder

OUT = Path(__file__).with_name("kvfleet-dashboard.json")
SEL = 'pool=~"$pool"'


def _quantiles(family: str) -> list[tuple[str, str]]:
    return [(f"histogram_quantile({q}, sum by (le) (rate({family}_bucket{{{SEL}}}[5m])))",
             f"p{int(q * 100)}") for q in (0.5, 0.9, 0.99)]  # fmt: skip


# (title, unit, [(PromQL, legend)])
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Time to first token", "s", _quantiles("vllm:time_to_first_token_seconds")),
    ("Inter-token latency", "s", _quantiles("vllm:inter_token_latency_seconds")),
    ("Queue", "short", [
        (f"sum by (role) (vllm:num_requests_waiting{{{SEL}}})", "waiting {{role}}"),
        (f"sum by (role) (vllm:num_requests_running{{{SEL}}})", "running {{role}}"),
        (f"sum(kvfleet_pool_held_requests{{{SEL}}})", "held by the router"),
    ]),
    ("KV cache use", "percentunit", [
        (f"avg by (role) (vllm:kv_cache_usage_perc{{{SEL}}})", "mean {{role}}"),
        (f"max by (role) (vllm:kv_cache_usage_perc{{{SEL}}})", "max {{role}}"),
    ]),
    ("Replicas per role: desired vs ready", "short", [
        (f"kvfleet_pool_replicas{{{SEL}}}", "{{role}} {{state}}"),
    ]),
    ("Prefix-cache hit rate", "percentunit", [
        (f"sum(rate(vllm:prefix_cache_hits_total{{{SEL}}}[5m])) / "
         f"sum(rate(vllm:prefix_cache_queries_total{{{SEL}}}[5m]))", "engines (tokens)"),
        (f"avg(kvfleet_router_prefix_hit_ratio{{{SEL}}})", "router estimate"),
    ]),
    ("Router load imbalance ((max - min) / mean load)", "short", [
        (f"max by (role) (kvfleet_router_load_imbalance{{{SEL}}})", "queue depth {{role}}"),
        (f"max(kvfleet_router_imbalance{{{SEL}}})", "in-flight / capacity, all roles"),
    ]),
    ("Scale decisions", "short", [
        (f"sum by (reason) (increase(kvfleet_scale_decisions_total{{{SEL}}}[5m]))", "{{reason}}"),
    ]),
    ("Router rejections", "reqps", [
        (f"sum by (reason) (rate(kvfleet_router_rejected_total{{{SEL}}}[5m]))", "{{reason}}"),
    ]),
    # Flow control (router/README.md "Flow control", "Quotas and API keys")
    ("Flow control: queued per band", "short", [
        (f"sum by (band) (kvfleet_router_flow_queue_length{{{SEL}}})", "{{band}}"),
    ]),
    ("Flow control: dispatched per tenant", "reqps", [
        (f"sum by (band, tenant) (rate(kvfleet_router_flow_dispatched_total{{{SEL}}}[5m]))",
         "{{band}} / {{tenant}}"),
    ]),
    ("Flow control: requests that waited per tenant", "reqps", [
        (f"sum by (band, tenant) (rate(kvfleet_router_flow_queued_total{{{SEL}}}[5m]))",
         "{{band}} / {{tenant}}"),
    ]),
    ("Flow control: rejected by reason", "reqps", [
        (f"sum by (tenant, reason) (rate(kvfleet_router_flow_rejected_total{{{SEL}}}[5m])) "
         f"or sum by (reason) (rate(kvfleet_router_rejected_total{{{SEL}, "
         "reason=~\"no-api-key|invalid-api-key\"}[5m]))", "{{tenant}} {{reason}}"),
    ]),
    ("Flow control: queue time p90 per tenant", "s", [
        ("histogram_quantile(0.9, sum by (band, tenant, le) "
         f"(rate(kvfleet_router_flow_queue_seconds_bucket{{{SEL}}}[5m])))",
         "{{band}} / {{tenant}}"),
    ]),
    ("Flow control: tokens served per tenant", "short", [
        (f"sum by (band, tenant) (rate(kvfleet_router_flow_tokens_total{{{SEL}}}[5m]))",
         "{{band}} / {{tenant}}"),
    ]),
    ("Flow control: fairness among backlogged tenants (Jain's index; 1 = by weight)",
     "percentunit", [
        (f"min by (band) (kvfleet_router_flow_fairness{{{SEL}}})", "{{band}}"),
    ]),
    # Rollouts: what the routers measured per engine revision (router/README.md "Revisions
    # and traffic split"), the figures a canary's analysis compares
    ("Rollout: requests per revision", "reqps", [
        (f"sum by (revision, outcome) (rate(kvfleet_router_revision_requests_total{{{SEL}}}"
         "[5m]))", "{{revision}} {{outcome}}"),
    ]),
    ("Rollout: error rate per revision", "percentunit", [
        (f"sum by (revision) (rate(kvfleet_router_revision_requests_total{{{SEL}, "
         f"outcome=\"error\"}}[5m])) / sum by (revision) "
         f"(rate(kvfleet_router_revision_requests_total{{{SEL}}}[5m]))", "{{revision}}"),
    ]),
    ("Rollout: time to first token p90 per revision", "s", [
        ("histogram_quantile(0.9, sum by (revision, le) "
         f"(rate(kvfleet_router_revision_ttft_seconds_bucket{{{SEL}}}[5m])))", "{{revision}}"),
    ]),
    ("Rollout: inter-token latency p90 per revision", "s", [
        ("histogram_quantile(0.9, sum by (revision, le) "
         f"(rate(kvfleet_router_revision_itl_seconds_bucket{{{SEL}}}[5m])))", "{{revision}}"),
    ]),
]


def build() -> Dashboard:
    pools = (QueryVariable("pool").label("pool").query("label_values(kvfleet_pool_replicas, pool)")
             .include_all(True).multi(True))  # fmt: skip
    dashboard = (Dashboard("kvfleet").uid("kvfleet").tags(["kvfleet", "llm"]).refresh("30s")
                 .with_variable(pools))  # fmt: skip
    for i, (title, unit, queries) in enumerate(PANELS):
        panel = Panel().title(title).unit(unit).height(8).span(12)
        for j, (expr, legend) in enumerate(queries):
            panel = panel.with_target(Dataquery().expr(expr).legend_format(legend)
                                      .ref_id(chr(ord("A") + j)))  # fmt: skip
        dashboard = dashboard.with_panel(panel.id(i + 1))
    return dashboard


def render() -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


def main() -> int:
    OUT.write_text(render())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
