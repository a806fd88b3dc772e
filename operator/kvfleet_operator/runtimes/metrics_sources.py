"""The loop's `MetricsSource` port over HTTP: scrape each replica, or ask Prometheus.

- `ScrapeMetrics`: GET every replica's `/metrics` at once (the default).
- `PrometheusMetrics`: one instant query to a Prometheus server for every replica's
  series, where scraping pods directly is not possible; series are matched to replicas by
  a label (`pod` on Kubernetes). A replica missing from the answer is a failed scrape, so
  it ages into unknown, never idle.

Their I/O, one function each: `scrape(session, replica, url, now)` (one replica's
`/metrics`; a failure becomes `Scrape(sample=None)`), and `query_prometheus(session,
base_url, selector, now)` (one instant query; `samples_from_prometheus` is its pure half:
series back to exposition text, read by the one `/metrics` parser).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import aiohttp

from kvfleet_operator.decide.role_signals import (
    MetricsParseError,
    ReplicaSample,
    Scrape,
    parse_metrics,
)
from kvfleet_operator.loop.ports import Replica


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


    async def query_value(self, promql: str) -> float | None:
        """A rollout analysis' own query: its one number, or None (no answer, no series,
        several series, not a finite number)."""
        return await instant_value(self._session, self.base_url, promql, self.timeout_s)


async def instant_value(session: Any, base_url: str, promql: str,
                        timeout_s: float = 5.0) -> float | None:
    """One PromQL instant query that must answer one finite number (a scalar or a
    one-series vector); anything else is None."""
    url = base_url.rstrip("/") + "/api/v1/query"
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url, params={"query": promql}, timeout=timeout) as resp:
            if resp.status != 200:
                return None
            body = await resp.json(content_type=None)
        data = body.get("data") or {} if isinstance(body, dict) else {}
        result = data.get("result")
        if data.get("resultType") == "scalar" and isinstance(result, list):
            value = float(result[1])
        elif data.get("resultType") == "vector" and isinstance(result, list) \
                and len(result) == 1:  # fmt: skip
            value = float(result[0]["value"][1])
        else:
            return None
    except (TimeoutError, aiohttp.ClientError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, OSError):  # fmt: skip
        return None
    return value if math.isfinite(value) else None


async def scrape(session, replica: str, url: str, now: float, timeout_s: float = 2.0) -> Scrape:
    """GET `url` (a replica's /metrics) with an aiohttp session; failures become Scrape(None)."""

    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url, timeout=timeout) as resp:
            if resp.status != 200:
                return Scrape(t=now, sample=None, error=f"{replica}: HTTP {resp.status}")
            text = await resp.text()
        return Scrape(t=now, sample=parse_metrics(text))
    except (TimeoutError, aiohttp.ClientError, MetricsParseError, OSError) as exc:
        return Scrape(t=now, sample=None, error=f"{replica}: {type(exc).__name__}: {exc}")


METRIC_NAME_REGEX = "vllm:.+|kvfleet:.+"


def _exposition_line(name: str, labels: dict[str, str], value: str) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    inner = ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}} {value}"


def samples_from_prometheus(result: Any, replica_label: str = "pod") -> dict[str, ReplicaSample]:
    """A Prometheus instant-query `data.result` vector -> one sample per replica.

    Series are rendered back to exposition text and read by `parse_metrics`, so names
    (current and legacy) are handled in one place. A replica without a usable core gauge
    is left out (it ages into unknown). Raises MetricsParseError on a malformed result."""
    if not isinstance(result, list):
        raise MetricsParseError("Prometheus result must be a vector (a list of series)")
    lines: dict[str, list[str]] = {}
    for series in result:
        try:
            labels = dict(series["metric"])
            name = labels.pop("__name__")
            value = str(float(series["value"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise MetricsParseError(
                f"malformed series in Prometheus result: {series!r:.120}"
            ) from None
        replica = labels.pop(replica_label, None)
        if replica is None:
            continue  # not attributable to a replica
        lines.setdefault(str(replica), []).append(_exposition_line(name, labels, value))
    samples: dict[str, ReplicaSample] = {}
    for replica, exposition in lines.items():
        try:
            samples[replica] = parse_metrics("\n".join(exposition) + "\n")
        except MetricsParseError:
            continue  # no core gauge for this replica: left out, so it ages into unknown
    return samples


async def query_prometheus(
    session: Any,
    base_url: str,
    selector: str,
    now: float,
    replica_label: str = "pod",
    timeout_s: float = 5.0,
) -> dict[str, Scrape]:
    """One instant query for every vLLM/kvfleet series matching `selector` (PromQL label
    matchers, e.g. 'namespace="llm",pod=~"pool-.*"'). A failed query returns {}: every
    replica then ages into unknown, never idle."""
    matchers = f'__name__=~"{METRIC_NAME_REGEX}"' + (f",{selector}" if selector else "")
    url = base_url.rstrip("/") + "/api/v1/query"
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url, params={"query": f"{{{matchers}}}"}, timeout=timeout) as resp:
            if resp.status != 200:
                return {}
            body = await resp.json(content_type=None)
        if not isinstance(body, dict) or body.get("status") != "success":
            return {}
        data = body.get("data") or {}
        samples = samples_from_prometheus(data.get("result"), replica_label)
    except (TimeoutError, aiohttp.ClientError, MetricsParseError, ValueError, OSError):
        return {}
    return {r: Scrape(t=now, sample=s) for r, s in samples.items()}
