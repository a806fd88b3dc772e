"""The alerts and the dashboard against the real thing: a real Prometheus scrapes a live
local fleet (`kvfleet up` on simulated engines, under load), and every dashboard panel's
query and every alert's signal returns series. The Prometheus metrics source of the control
loop reads the same server. Skipped without Debian's prometheus (`.ci/run` installs it)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import yaml
from e2e_fleet import POOLS
from e2e_loadgen import run_load

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers
from helpers.procs import ProcessGroup, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus not installed")]
MODEL = "llama3-8b"

# Each alert's signal: the query it compares with a threshold. The test checks the alert's
# expression really contains it, and that it returns series from a live fleet.
SIGNALS = {
    "KvfleetNoReadyReplica": ['kvfleet_pool_replicas{state="desired"}',
                              'kvfleet_pool_replicas{state="ready"}'],
    "KvfleetScalingLimitedAtMax": ['kvfleet_pool_condition{type="ScalingLimited", '
                                   'status="True", reason="AtMaxReplicas"}'],
    "KvfleetTTFTOverTarget": [
        "histogram_quantile(0.9, sum by (pool, le) "
        "(rate(vllm:time_to_first_token_seconds_bucket[5m])))",
        "kvfleet_pool_ttft_p90_target_seconds"],
    "KvfleetKVCacheFullWithPreemptions": [
        "max by (pool) (vllm:kv_cache_usage_perc)",
        "sum by (pool) (rate(vllm:num_preemptions_total[5m]))"],
    "KvfleetRouterRejecting": [
        'sum by (pool) (rate(kvfleet_router_rejected_total{reason=~"saturated|queue-full"}[5m]))'],
    "KvfleetDrainTimeouts": ["increase(kvfleet_drain_timeouts_total[1h])"],
    "KvfleetReplicaCrashLooping": ["increase(kvfleet_replica_crashes_total[15m])"],
    "KvfleetRolloutRolledBack": ["increase(kvfleet_rollbacks_total[1h])"],
    "KvfleetTenantThrottled": [
        "sum by (pool, tenant) "
        '(rate(kvfleet_router_flow_rejected_total{reason=~"saturated|queue-full"}[5m]))'],
    "KvfleetQuotaThrottling": [
        "sum by (pool, tenant, reason) "
        '(rate(kvfleet_router_flow_rejected_total{reason=~"quota-.*"}[5m]))'],
}
# A signal that exists only once its condition holds: checked for its metric, not a value.
PRESENT_ONLY = {'kvfleet_pool_condition{type="ScalingLimited", status="True", '
                'reason="AtMaxReplicas"}': 'kvfleet_pool_condition{type="ScalingLimited"}'}


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _alerts() -> dict[str, str]:
    doc = yaml.safe_load((ROOT / "observability/prometheus/kvfleet-alerts.yaml").read_text())
    return {r["alert"]: _flat(r["expr"]) for g in doc["groups"] for r in g["rules"]}


def _panel_queries() -> list[str]:
    doc = json.loads((ROOT / "observability/grafana/kvfleet-dashboard.json").read_text())
    return [t["expr"].replace("$pool", ".*") for p in doc["panels"] for t in p["targets"]]


def _query(prom: str, query: str) -> list:
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_every_alert_has_its_signals_listed():
    alerts = _alerts()
    assert set(alerts) == set(SIGNALS)
    for name, signals in SIGNALS.items():
        for signal in signals:
            assert _flat(signal) in alerts[name], (name, signal)


def test_the_dashboard_json_is_what_its_builder_writes():
    sys.path.insert(0, str(ROOT / "observability" / "grafana"))
    import build_dashboard

    assert build_dashboard.render() == build_dashboard.OUT.read_text()


def test_dashboard_and_alert_queries_return_series_from_a_live_fleet(tmp_path, start_fleet):
    manifest = yaml.safe_load((POOLS / "sim-unified.yaml").read_text())
    manifest["metadata"]["name"] = "observed"
    manifest["spec"]["autoscaling"]["targets"]["ttftP90Seconds"] = 2.0
    # A fixed size: the replicas Prometheus scrapes (static targets) stay for the whole run.
    manifest["spec"]["topology"]["unified"]["replicas"] = {"min": 2, "max": 2}
    pool_file = tmp_path / "observed.yaml"
    pool_file.write_text(yaml.safe_dump(manifest))
    fleet = start_fleet(str(pool_file))
    state = fleet.wait_for("two ready replicas", lambda s: s.get("is_serving") and sum(
        r["state"] == "ready" for r in s["replicas"] if r["role"] == "unified") == 2, 60)
    router = next(r for r in state["replicas"] if r["role"] == "router")
    engines = [r for r in state["replicas"] if r["role"] == "unified"]
    engine = engines[0]

    def hostport(url: str) -> str:
        return url.removeprefix("http://").split("/")[0]

    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "kvfleet", "static_configs": [
            {"targets": [hostport(state["metrics_endpoint"])]}]},
        {"job_name": "router", "static_configs": [
            {"targets": [hostport(router["address"])], "labels": {"pool": "observed"}}]},
        {"job_name": "engines", "static_configs": [
            {"targets": [hostport(e["address"])],
             "labels": {"pool": "observed", "role": "unified", "pod": e["name"]}}
            for e in engines]},
    ]}  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    with ProcessGroup(tmp_path / "procs") as procs:
        port = free_port()
        prom = procs.start(
            [str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
            health_path="/-/ready", port=port, timeout_s=60,
        ).url  # fmt: skip
        load = asyncio.run(run_load(fleet.endpoint, MODEL, concurrency=12, duration_s=12,
                                    max_tokens=32))  # fmt: skip
        assert load.num_failed == 0
        time.sleep(3)  # a few scrapes after the load
        missing = []
        for signals in SIGNALS.values():
            for signal in signals:
                query = PRESENT_ONLY.get(signal, signal)
                if not _query(prom, query):
                    missing.append(query)
        missing += [q for q in _panel_queries() if not _query(prom, q)]
        assert missing == [], missing

        from kvfleet_operator.runtimes.metrics_sources import PrometheusMetrics

        class Replica:
            name, role, state, address = engine["name"], "unified", "ready", engine["address"]
            started_at, num_restarts, last_error = 0.0, 0, ""

        async def via_prometheus():
            async with aiohttp.ClientSession() as http:
                return await PrometheusMetrics(http, prom, 'pool="observed"').sample(
                    [Replica()], now=time.time())

        sample = asyncio.run(via_prometheus())[engine["name"]].sample
        assert sample is not None and sample.num_generation_tokens > 0
