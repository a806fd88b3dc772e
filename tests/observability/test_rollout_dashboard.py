"""The dashboard's rollout panels read what the router really exports per engine revision:
every `kvfleet_router_revision_*` name in a panel's query is in a rendered router registry,
and requests, error rate, TTFT p90 and ITL p90 each have a panel split by revision."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvfleet_router.app import RouterApp
from kvfleet_router.config import RouterConfig

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "observability" / "grafana" / "kvfleet-dashboard.json"


def _exported() -> set[str]:
    app = RouterApp(RouterConfig())  # wired as the router runs: the collector registered
    counts = app.admin.meter.of("aaaa111111")  # type: ignore[union-attr]
    assert counts is not None
    counts.record(is_error=False)
    counts.observe_ttft(0.1)
    counts.observe_itl(0.02)
    text = app.metrics.render().decode()
    return set(re.findall(r"^(kvfleet_router_revision_\w+)", text, re.M))


def _revision_queries() -> dict[str, str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: p["targets"][0]["expr"] for p in panels
            if "kvfleet_router_revision_" in p["targets"][0]["expr"]}


def test_every_rollout_panel_reads_an_exported_metric():
    exported = _exported()
    for title, expr in _revision_queries().items():
        for name in re.findall(r"kvfleet_router_revision_\w+", expr):
            assert name in exported, f"{title}: {name} is not exported"


def test_each_revision_signal_has_a_panel_split_by_revision():
    queries = _revision_queries()
    exprs = " ".join(queries.values())
    for metric in ("revision_requests_total", "revision_ttft_seconds_bucket",
                   "revision_itl_seconds_bucket"):
        assert f"kvfleet_router_{metric}" in exprs, metric
    assert any('outcome="error"' in q for q in queries.values())  # the error rate
    assert all("by (revision" in q for q in queries.values())
