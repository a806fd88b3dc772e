"""The loop's `MetricsSource` port over HTTP: scrape each replica, or ask Prometheus.

- `ScrapeMetrics`: GET every replica's `/metrics` at once (the default).
- `PrometheusMetrics`: one instant query to a Prometheus server for every replica's
  series, where scraping pods directly is not possible; series are matched to replicas by
  a label (`pod` on Kubernetes). A replica missing from the answer is a failed scrape, so
  it ages into unknown, never idle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp

from kvfleet_operator.loop.ports import Replica
from kvfleet_operator.signals import Scrape, query_prometheus, scrape


class ScrapeMetrics:
    def __init__(self, session: aiohttp.ClientSession, timeout_s: float = 2.0) -> None:
        self._session = session
        self.timeout_s = timeout_s

    async def sample(self, replicas: Sequence[Replica], now: float) -> dict[str, Scrape]:
        results = await asyncio.gather(
            *(scrape(self._session, r.name, f"{r.address}/metrics", now, self.timeout_s)
              for r in replicas)  # fmt: skip
        )
        return {r.name: result for r, result in zip(replicas, results, strict=True)}


class PrometheusMetrics:
    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, selector: str = "",
        replica_label: str = "pod", timeout_s: float = 5.0,
    ) -> None:  # fmt: skip
        self._session = session
        self.base_url = base_url
        self.selector = selector
        self.replica_label = replica_label
        self.timeout_s = timeout_s

    async def sample(self, replicas: Sequence[Replica], now: float) -> dict[str, Scrape]:
        found = await query_prometheus(self._session, self.base_url, self.selector, now,
                                       self.replica_label, self.timeout_s)  # fmt: skip
        missing = f"no series in Prometheus for this replica ({self.replica_label})"
        return {
            r.name: found.get(r.name) or Scrape(t=now, sample=None, error=f"{r.name}: {missing}")
            for r in replicas
        }
