"""The dashboard's flow-control panels read metrics the router really exports: every
`kvfleet_router_flow_*` name in a panel's query is in a rendered router registry, and
each of queued, dispatched, rejected, queue time, tokens served and fairness has a panel."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvfleet_router.config import RouterConfig
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.router_core import RouterCore

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "observability" / "grafana" / "kvfleet-dashboard.json"


def _exported() -> set[str]:
    core = RouterCore(RouterConfig())
    m = RouterMetrics(lambda: core, lambda: 0, fairness=lambda: {})
    labels = ("standard", "t")
    m.flow_queued.labels(*labels).inc()
    m.flow_dispatched.labels(*labels).inc()
    m.flow_rejected.labels(*labels, "saturated").inc()
    m.flow_queue_seconds.labels(*labels).observe(0.1)
    m.flow_tokens.labels(*labels).inc(10)
    text = m.render().decode()
    return set(re.findall(r"^(kvfleet_router_\w+)", text, re.M))


def _flow_queries() -> dict[str, str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: p["targets"][0]["expr"] for p in panels
            if "kvfleet_router_flow_" in p["targets"][0]["expr"]}


def test_every_flow_panel_reads_an_exported_metric():
    exported = _exported()
    queries = _flow_queries()
    for title, expr in queries.items():
        for name in re.findall(r"kvfleet_router_\w+", expr):
            assert name in exported, f"{title}: {name} is not exported"


def test_each_flow_signal_has_a_panel():
    exprs = " ".join(_flow_queries().values())
    for metric in ("flow_queue_length", "flow_queued_total", "flow_dispatched_total",
                   "flow_rejected_total", "flow_queue_seconds_bucket", "flow_tokens_total",
                   "flow_fairness"):
        assert f"kvfleet_router_{metric}" in exprs, metric
