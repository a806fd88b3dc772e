"""The Prometheus metrics source against a real Prometheus server scraping a real engine:
the samples the loop gets through Prometheus match what scraping the engine gives.

Needs Debian's `prometheus` binary (`.ci/run` installs it); skipped where it is absent."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from fake_ports import FakeReplica

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers
from helpers.procs import ProcessGroup, free_port, kvfleet_argv  # noqa: E402
from kvfleet_operator.runtimes.metrics_sources import (  # noqa: E402
    PrometheusMetrics,
    ScrapeMetrics,
)

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus not installed")


def _complete(url: str, n: int) -> None:
    body = json.dumps({"model": "tiny-random", "prompt": "hello there", "max_tokens": n}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def _query(prom: str, query: str) -> list:
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())["data"]["result"]


def test_prometheus_source_matches_a_direct_scrape(tmp_path):
    assert PROMETHEUS is not None
    with ProcessGroup(tmp_path / "procs") as procs:
        engine = procs.start(kvfleet_argv(
            "engine", "--model", "tiny-random", "--runner", "simulated", "--profile",
            "h100-llama3-8b", "--port", "{port}"))  # fmt: skip
        for n in (3, 5):
            _complete(engine.url, n)
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: engines\n"
            "    static_configs:\n"
            f"      - targets: ['127.0.0.1:{engine.port}']\n"
            "        labels: {pod: unified-0, namespace: llm}\n"
        )
        port = free_port()
        prom = procs.start(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            health_path="/-/ready", port=port, timeout_s=60,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not _query(prom.url, 'vllm:generation_tokens_total{pod="unified-0"}'):
            assert time.monotonic() < deadline, "Prometheus never scraped the engine"
            time.sleep(0.5)

        replicas = [FakeReplica("unified-0", "unified", "ready"),
                    FakeReplica("unified-9", "unified", "ready")]  # fmt: skip

        async def both():
            async with aiohttp.ClientSession() as http:
                via_prom = await PrometheusMetrics(http, prom.url, 'namespace="llm"').sample(
                    replicas, now=1.0)
                direct_replica = FakeReplica("unified-0", "unified", "ready", address=engine.url)
                direct = await ScrapeMetrics(http).sample([direct_replica], now=1.0)
                source = PrometheusMetrics(http, prom.url)
                answers = [await source.query_value(q) for q in (  # a rollout's own query
                    'sum(vllm:generation_tokens_total{pod="unified-0"})',  # one series
                    "scalar(vector(2.5))",  # a scalar
                    'vllm:generation_tokens_total{pod="nobody"}',  # no series
                    "vector(1) or label_replace(vector(2), 'x', 'y', '', '')",  # two series
                    "sum(",  # not PromQL: 400
                )]
                return via_prom, direct, answers

        via_prom, direct, answers = asyncio.run(both())
        assert answers == [8.0, 2.5, None, None, None]
    got, want = via_prom["unified-0"].sample, direct["unified-0"].sample
    assert got is not None and want is not None, via_prom["unified-0"].error
    assert got.num_generation_tokens == want.num_generation_tokens == 8
    assert got.num_prompt_tokens == want.num_prompt_tokens > 0
    assert (got.num_running, got.num_waiting) == (want.num_running, want.num_waiting) == (0, 0)
    assert got.ttft and got.ttft == want.ttft  # histogram buckets survive the round trip
    missing = via_prom["unified-9"]
    assert missing.sample is None and "no series" in missing.error
