"""Router control over HTTP: the loop's `RouterControl` port for every router replica.

`HttpRouterControl` pushes a config to each router's admin API (success only when all
accepted it), combines their views (in-flight summed per endpoint, the oldest version), and
sums the requests they hold (`kvfleet_router_queue_length`), and reads the perf-model fits
they export (`kvfleet_router_perf_model_coefficient`, combined across routers). A router pod
of several workers answers for all of them (kvfleet_router.worker_views): its GET
/admin/config is already summed, its /metrics carries one sample per worker (`worker`
label), summed or combined here as several routers' are. Each view
carries what the router measured per engine revision (`revisions` in its GET
/admin/config, summed over routers): the rollout analysis reads it.
Endpoints: kvfleet_router.admin.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import aiohttp
from kvfleet_engine.contract import parse_text
from kvfleet_router.perf_model import RoleCoefficients
from kvfleet_router.revision_stats import RevisionCounts, combine

from kvfleet_operator.decide.role_signals import (
    PERF_COEFFICIENT,
    PERF_EVIDENCE,
    combine_perf_models,
    parse_router_perf_models,
)
from kvfleet_operator.loop.ports import EndpointView, RouterControlError, RouterView

QUEUE_METRIC = "kvfleet_router_queue_length"
PERF_METRICS = (PERF_COEFFICIENT, PERF_EVIDENCE)


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def put_config(
    session: aiohttp.ClientSession, base_url: str, token: str, config: dict[str, Any]
) -> None:
    try:
        async with session.put(f"{base_url}/admin/config", json=config, headers=_auth(token)) as r:
            if r.status != 200:
                body = await r.text()
                raise RouterControlError(
                    f"config push to {base_url} refused: HTTP {r.status}: {body[:300]}"
                )
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise RouterControlError(
            f"config push to {base_url} failed: {type(exc).__name__}: {exc}"
        ) from None


async def get_view(session: aiohttp.ClientSession, base_url: str, token: str) -> RouterView:
    try:
        async with session.get(f"{base_url}/admin/config", headers=_auth(token)) as r:
            if r.status != 200:
                raise RouterControlError(f"router admin GET {base_url}: HTTP {r.status}")
            data = await r.json()
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        raise RouterControlError(
            f"router admin GET {base_url} failed: {type(exc).__name__}: {exc}"
        ) from None
    try:
        return RouterView(
            version=int(data["version"]),
            endpoints={
                e["name"]: EndpointView(
                    e["name"], str(e["state"]), int(e["num_in_flight"]), bool(e["is_healthy"])
                )
                for e in data["endpoints"]
            },
            revisions=_revisions(data.get("revisions")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RouterControlError(f"router admin GET: unexpected answer: {exc!r}") from None


def _revisions(raw: Any) -> dict[str, RevisionCounts]:
    """The router's per-revision counters; {} when it reports none (an older router)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"revisions must be an object, got {type(raw).__name__}")
    out: dict[str, RevisionCounts] = {}
    for revision, counts in raw.items():
        try:
            out[revision] = RevisionCounts.from_dict(counts)
        except ValueError as exc:
            raise ValueError(f"revisions[{revision!r}]: {exc}") from None
    return out


def combine_views(views: Sequence[RouterView]) -> RouterView:
    """One view of several routers: in-flight and per-revision counters summed, healthy
    only if healthy in all, the oldest config version (so a router that missed a push gets
    it again) and the newest (so a loop that never recorded a push it made pushes above
    it)."""
    out = RouterView(version=min(v.version for v in views),
                     newest_version=max(v.version for v in views),
                     revisions=combine([v.revisions for v in views]))
    for view in views:
        for name, e in view.endpoints.items():
            seen = out.endpoints.get(name)
            if seen is None:
                out.endpoints[name] = EndpointView(name, e.state, e.num_in_flight, e.is_healthy)
            else:
                seen.num_in_flight += e.num_in_flight
                seen.is_healthy = seen.is_healthy and e.is_healthy
    return out


async def get_queue_length(session: aiohttp.ClientSession, base_url: str) -> int | None:
    """Requests the router holds for capacity (scale-from-zero demand); None if unreadable."""
    try:
        async with session.get(f"{base_url}/metrics") as r:
            if r.status != 200:
                return None
            text = await r.text()
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None
    return queue_length_in(text)


def queue_length_in(text: str) -> int | None:
    """`kvfleet_router_queue_length` of one router's /metrics text, summed over its workers
    (a pod of `--workers N` labels each worker's sample `worker`); None if absent."""
    samples = parse_text(text, only=[QUEUE_METRIC]).samples  # the one /metrics reader
    values = [x.value for x in samples if x.name == QUEUE_METRIC and math.isfinite(x.value)]
    return int(sum(values)) if values else None


def perf_models_in(text: str) -> dict[str, RoleCoefficients]:
    """The perf-model fits of one router's /metrics text: a pod's workers (samples labelled
    `worker`) each fit their own streams, combined as several routers' are."""
    by_worker: dict[str, list[str]] = {}
    for line in text.splitlines():
        for x in parse_text(line, only=PERF_METRICS).samples:
            by_worker.setdefault(x.labels.get("worker", ""), []).append(line)
    return combine_perf_models(parse_router_perf_models("\n".join(lines))
                               for lines in by_worker.values())


async def get_perf_models(session: aiohttp.ClientSession, base_url: str
                          ) -> dict[str, RoleCoefficients]:
    """The perf-model fits one router exports; {} if unreadable (the seed then serves)."""
    try:
        async with session.get(f"{base_url}/metrics") as r:
            if r.status != 200:
                return {}
            text = await r.text()
    except (TimeoutError, aiohttp.ClientError, OSError):
        return {}
    return perf_models_in(text)


class HttpRouterControl:
    """Every router replica of one pool, by base URL, behind one admin token."""

    def __init__(self, session: aiohttp.ClientSession, urls: Sequence[str], token: str) -> None:
        if not urls:
            raise ValueError("at least one router URL is needed")
        self._session = session
        self.urls = list(urls)
        self._token = token  # never logged

    async def push(self, config: dict[str, Any]) -> None:
        results = await asyncio.gather(
            *(put_config(self._session, url, self._token, config) for url in self.urls),
            return_exceptions=True,
        )
        errors = [str(r) for r in results if isinstance(r, BaseException)]
        if errors:
            raise RouterControlError("; ".join(errors))

    async def view(self) -> RouterView | None:
        try:
            views = await asyncio.gather(
                *(get_view(self._session, url, self._token) for url in self.urls)
            )
        except RouterControlError:
            return None
        return combine_views(views)

    async def num_held(self) -> int:
        held = await asyncio.gather(*(get_queue_length(self._session, u) for u in self.urls))
        return sum(n or 0 for n in held)

    async def perf_models(self) -> dict[str, RoleCoefficients]:
        fits = await asyncio.gather(*(get_perf_models(self._session, u) for u in self.urls))
        return combine_perf_models(fits)
