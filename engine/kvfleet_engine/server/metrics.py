"""Prometheus metrics under vLLM v1 names (see contract.py), one registry per server.

Two sources feed it:
- the engine's own counters and gauges (`EngineStats` snapshots taken on the engine
  thread), read at scrape time by a custom collector, so they are never stale;
- latencies the server observes per request (histograms), as the client sees them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvfleet_engine import contract
from kvfleet_engine.server.peer_metrics import PeerPrefixMetrics

LABELS = [contract.MODEL_LABEL]

# Bucket edges in seconds, spanning CPU-tiny to GPU-sized models (similar to vLLM's).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
               40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)
QUEUE_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                 20.0, 40.0, 80.0, 160.0, 320.0)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _EngineStatsCollector(Collector):
    """Reads the newest EngineStats snapshot at scrape time."""

    def __init__(self, model_name: str, read_stats: Callable[[], Any]) -> None:
        self._model = model_name
        self._read_stats = read_stats

    def collect(self) -> Iterator[Any]:
        stats = self._read_stats()
        if stats is None:
            return
        labels = [self._model]
        gauges = (
            (contract.NUM_REQUESTS_RUNNING, "Requests in the running batch.", stats.num_running),
            (contract.NUM_REQUESTS_WAITING, "Requests waiting to be scheduled.", stats.num_waiting),
            (contract.KV_CACHE_USAGE_PERC, "KV-cache usage, a 0-1 fraction.", stats.kv_usage),
            (
                contract.NUM_WAITING_PROMPT_TOKENS,
                "Uncached prompt tokens of waiting requests.",
                stats.num_waiting_prompt_tokens,
            ),
        )
        for name, doc, value in gauges:
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, float(value))
            yield family
        counters = (
            (contract.PREFIX_CACHE_QUERIES, "Prefix-cache queries, in tokens.",
             stats.prefix_cache_queries),
            (contract.PREFIX_CACHE_HITS, "Prefix-cache hits, in tokens.", stats.prefix_cache_hits),
            (contract.NUM_PREEMPTIONS, "Preemptions (by recompute).", stats.num_preemptions),
            (contract.PROMPT_TOKENS, "Prompt tokens computed.", stats.num_prompt_tokens),
            (contract.GENERATION_TOKENS, "Tokens generated.", stats.num_generation_tokens),
        )
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=LABELS)
            counter.add_metric(labels, float(value))
            yield counter


class ServerMetrics:
    def __init__(
        self,
        model_name: str,
        role: str,
        *,
        block_size: int,
        num_gpu_blocks: int,
        read_stats: Callable[[], Any],
    ) -> None:
        self.registry = CollectorRegistry()
        self._model = model_name
        reg = self.registry
        self.registry.register(_EngineStatsCollector(model_name, read_stats))
        self.ttft = Histogram(contract.TIME_TO_FIRST_TOKEN, "Time to first token.", LABELS,
                              registry=reg, buckets=TTFT_BUCKETS).labels(model_name)
        self.itl = Histogram(contract.INTER_TOKEN_LATENCY, "Time between output tokens.", LABELS,
                             registry=reg, buckets=ITL_BUCKETS).labels(model_name)
        self.tpot = Histogram(contract.REQUEST_TIME_PER_OUTPUT_TOKEN,
                              "Mean time per output token after the first, per request.",
                              LABELS, registry=reg, buckets=ITL_BUCKETS).labels(model_name)
        self.e2e = Histogram(contract.E2E_REQUEST_LATENCY, "Arrival to last token.", LABELS,
                             registry=reg, buckets=E2E_BUCKETS).labels(model_name)
        self.queue_time = Histogram(contract.REQUEST_QUEUE_TIME, "Time spent queued.", LABELS,
                                    registry=reg, buckets=QUEUE_BUCKETS).labels(model_name)
        cache_info = Gauge(contract.CACHE_CONFIG_INFO, "KV-cache configuration.",
                           ["block_size", "num_gpu_blocks", contract.MODEL_LABEL], registry=reg)
        cache_info.labels(str(block_size), str(num_gpu_blocks), model_name).set(1)
        role_info = Gauge(contract.ROLE_INFO, "This replica's P/D role.",
                          ["role", contract.MODEL_LABEL], registry=reg)
        role_info.labels(role, model_name).set(1)
        self._draining = Gauge(contract.DRAINING, "1 while draining after SIGTERM.", LABELS,
                               registry=reg).labels(model_name)
        self.peer = PeerPrefixMetrics(reg, model_name)

    def set_draining(self, is_draining: bool) -> None:
        self._draining.set(1 if is_draining else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def queue_time_s(output: Any) -> float | None:
    """vllm:request_queue_time_seconds of a finished request's output: arrival to first
    scheduling, both on the engine's clock; None when the output carries no timing (a
    fake backend) or was never scheduled."""
    timing = getattr(output, "timing", None)
    scheduled = getattr(timing, "first_scheduled_time", None)
    if timing is None or scheduled is None or not math.isfinite(scheduled):
        return None
    return max(0.0, scheduled - timing.arrival_time)


def mean_time_per_output_token(first_token_at: float, last_token_at: float,
                                num_tokens: int) -> float:
    """vllm:request_time_per_output_token_seconds of one request: its decode time over the
    tokens after the first (vLLM's rule: 0 for a one-token answer)."""
    return (last_token_at - first_token_at) / (num_tokens - 1) if num_tokens > 1 else 0.0


class RequestTimer:
    """Feeds one request's latencies into the histograms as its outputs arrive."""

    __slots__ = ("_metrics", "arrival", "first_token_at", "last_token_at", "num_tokens")

    def __init__(self, metrics: ServerMetrics, arrival: float) -> None:
        self._metrics = metrics
        self.arrival = arrival
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.num_tokens = 0

    def on_output(self, output: Any, now: float) -> None:
        num_new = len(output.new_token_ids)
        if num_new:
            if self.last_token_at is None:
                self.first_token_at = now
                self._metrics.ttft.observe(now - self.arrival)
            else:
                gap = (now - self.last_token_at) / num_new
                for _ in range(num_new):
                    self._metrics.itl.observe(gap)
            self.last_token_at = now
            self.num_tokens += num_new
        if output.is_finished:
            self._metrics.e2e.observe(now - self.arrival)
            if self.first_token_at is not None and self.last_token_at is not None:
                self._metrics.tpot.observe(mean_time_per_output_token(
                    self.first_token_at, self.last_token_at, self.num_tokens))
            queued = queue_time_s(output)
            if queued is not None:
                self._metrics.queue_time.observe(queued)
