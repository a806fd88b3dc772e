"""Scrape each backend's /metrics (vLLM names, older names accepted) into `Signals`.

Read: running, waiting, KV usage (summed over label sets; KV averaged), the block size
and KV capacity in blocks from cache_config_info, kvfleet:draining (an engine that got
SIGTERM gets no new work), and a kvfleet engine's peer-prefix counters (`PeerTotals`, for
peer_measure.py).

`parse_metrics(text, now)` is pure; the parsing itself is `kvfleet_engine.contract`'s, shared
with the operator, and a body with no usable core gauge, or with a figure no engine can
report (a negative or huge count, KV usage outside 0-1, NaN), reads as unknown. `poll_forever`
refreshes every endpoint on an interval and marks an endpoint fresh only while its last
good scrape is younger than stale_after_s, so a silent backend reads as unknown, not idle.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable

import aiohttp
from kvfleet_engine import contract
from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.contract.metrics_text import PEER_FAMILIES, EngineMetrics

from kvfleet_router.endpoint import EndpointState, Signals
from kvfleet_router.peer_measure import PeerTotals

log = logging.getLogger(__name__)


def parse_metrics(text: str, now: float) -> Signals:
    """One /metrics body through the contract's gauges-only reader (its rules: label sets
    summed, KV usage averaged, current names over legacy ones, bad lines skipped).

    A body with no usable core gauge (an error page, garbage) yields `Signals()`, whose
    `scraped_at` of 0 is never fresh: the endpoint reads as unknown, not as idle."""
    m = contract.read_gauges(text, also=PEER_FAMILIES)
    if not m.is_usable:
        return Signals()
    g = m.gauges
    signals = Signals(num_running=g.get(contract.NUM_REQUESTS_RUNNING, 0.0),
                      num_waiting=g.get(contract.NUM_REQUESTS_WAITING, 0.0),
                      kv_usage=g.get(contract.KV_CACHE_USAGE_PERC, 0.0),
                      block_size=m.block_size or 0, num_gpu_blocks=m.num_gpu_blocks or 0,
                      scraped_at=now,
                      is_draining=m.is_draining, peer=peer_totals(m))
    if not is_plausible(signals) or _core_gauge_without_figure(text, g):
        return Signals()
    return signals


MAX_PLAUSIBLE_REQUESTS = 1e6  # running or waiting on one engine (the operator's limit too)
_CORE_SAMPLE = re.compile("^(" + "|".join(re.escape(n) for n in (
    *contract.CORE_GAUGES,
    *(old for old, new in contract.LEGACY_NAMES.items() if new in contract.CORE_GAUGES))
) + r")(?:\{[^}]*\})?[ \t]+(\S+)", re.M)


def _core_gauge_without_figure(text: str, gauges: dict[str, float]) -> bool:
    """A core gauge exposed with no finite value (only NaN or Inf): the reader leaves it
    out, so `waiting NaN` beside `running 0` would otherwise read as idle."""
    for name, value in _CORE_SAMPLE.findall(text):
        try:
            is_finite = math.isfinite(float(value))
        except ValueError:
            continue  # a malformed line: the reader skips it, as it should
        if not is_finite and contract.LEGACY_NAMES.get(name, name) not in gauges:
            return True
    return False


def is_plausible(s: Signals) -> bool:
    """What an engine can report: counts in [0, 1e6], KV usage in [0, 1] (NaN is neither).
    Garbage reads as unknown, so it can neither make an endpoint look idle nor busy."""
    return (0.0 <= s.num_running <= MAX_PLAUSIBLE_REQUESTS
            and 0.0 <= s.num_waiting <= MAX_PLAUSIBLE_REQUESTS and 0.0 <= s.kv_usage <= 1.0)


def peer_totals(m: EngineMetrics) -> PeerTotals | None:
    """The peer-sharing counters, or None when the engine exposes none of them (vLLM)."""
    c = m.counters
    totals = PeerTotals(fetch_bytes=c.get(pp.PEER_FETCH_BYTES),
                        fetch_blocks=c.get(pp.PEER_FETCH_BLOCKS),
                        fetch_seconds=m.histogram_sums.get(pp.PEER_FETCH_SECONDS),
                        export_bytes=c.get(pp.PEER_EXPORT_BYTES),
                        export_blocks=c.get(pp.PEER_EXPORT_BLOCKS),
                        timeout_bytes=c.get(pp.PEER_FETCH_TIMEOUT_BYTES),
                        timeout_seconds=c.get(pp.PEER_FETCH_TIMEOUT_SECONDS))
    return None if totals == PeerTotals() else totals


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
