"""Scrape each backend's /metrics (vLLM names, older names accepted) into `Signals`.

Read: running, waiting, KV usage (summed over label sets; KV averaged), the block size
from cache_config_info, and kvfleet:draining (an engine that got SIGTERM gets no new work).

`parse_metrics(text)` is pure. `poll_forever` refreshes every endpoint on an interval and
marks an endpoint fresh only while its last good scrape is younger than stale_after_s, so a
silent backend reads as unknown rather than idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from kvfleet_engine import contract

from kvfleet_router.endpoint import EndpointState, Signals

log = logging.getLogger(__name__)

_GAUGES = {
    contract.NUM_REQUESTS_RUNNING: "num_running",
    contract.NUM_REQUESTS_WAITING: "num_waiting",
    contract.KV_CACHE_USAGE_PERC: "kv_usage",
    contract.DRAINING: "draining",
}


def _split_sample(line: str) -> tuple[str, str, str] | None:
    """'name{labels} value [ts]' -> (name, labels, value)."""
    brace = line.find("{")
    if brace != -1:
        close = line.rfind("}")
        if close < brace:
            return None
        name, labels, rest = line[:brace], line[brace + 1:close], line[close + 1:]
    else:
        name, _, rest = line.partition(" ")
        labels = ""
    parts = rest.split()
    return (name.strip(), labels, parts[0]) if parts else None


def _label(labels: str, key: str) -> str | None:
    for item in labels.split(","):
        k, _, v = item.partition("=")
        if k.strip() == key:
            return v.strip().strip('"')
    return None


def parse_metrics(text: str, now: float) -> Signals:
    """Sum each gauge over its label sets (one per model); mean KV usage over them."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    block_size = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _split_sample(line)
        if sample is None:
            continue
        name, labels, value = sample
        name = contract.LEGACY_NAMES.get(name, name)
        if name == contract.CACHE_CONFIG_INFO:
            size = _label(labels, "block_size")
            block_size = int(float(size)) if size else block_size
            continue
        field = _GAUGES.get(name)
        if field is None:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        sums[field] = sums.get(field, 0.0) + number
        counts[field] = counts.get(field, 0) + 1
    if "kv_usage" in sums:
        sums["kv_usage"] /= counts["kv_usage"]
    return Signals(num_running=sums.get("num_running", 0.0),
                   num_waiting=sums.get("num_waiting", 0.0),
                   kv_usage=sums.get("kv_usage", 0.0), block_size=block_size, scraped_at=now,
                   is_draining=sums.get("draining", 0.0) > 0)


async def scrape(session: aiohttp.ClientSession, e: EndpointState, timeout_s: float) -> None:
    try:
        async with session.get(e.url + "/metrics",
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return
            text = await resp.text()
    except (TimeoutError, aiohttp.ClientError, OSError):
        return
    e.apply_scrape(parse_metrics(text, time.monotonic()))


async def poll_forever(session: aiohttp.ClientSession,
                       endpoints: Callable[[], list[EndpointState]],
                       interval_s: Callable[[], float], stale_after_s: Callable[[], float]) -> None:
    while True:
        eps = endpoints()
        await asyncio.gather(*(scrape(session, e, interval_s()) for e in eps))
        now = time.monotonic()
        for e in eps:
            e.is_signals_fresh = e.signals.is_fresh(now, stale_after_s())
        await asyncio.sleep(interval_s())
