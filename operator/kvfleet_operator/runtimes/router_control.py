"""A small client for the router's admin API and its queue gauge (see kvfleet_router.admin)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp

QUEUE_METRIC = "kvfleet_router_queue_length"


class RouterAdminError(RuntimeError):
    """The router did not accept or answer an admin call; the message says why."""


@dataclass(slots=True)
class EndpointView:
    name: str
    state: str
    num_in_flight: int
    is_healthy: bool


@dataclass(slots=True)
class RouterView:
    version: int
    endpoints: dict[str, EndpointView] = field(default_factory=dict)


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def put_config(
    session: aiohttp.ClientSession, base_url: str, token: str, config: dict[str, Any]
) -> None:
    try:
        async with session.put(f"{base_url}/admin/config", json=config, headers=_auth(token)) as r:
            if r.status != 200:
                body = await r.text()
                raise RouterAdminError(f"config push refused: HTTP {r.status}: {body[:300]}")
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise RouterAdminError(f"config push failed: {type(exc).__name__}: {exc}") from None


async def get_view(session: aiohttp.ClientSession, base_url: str, token: str) -> RouterView:
    try:
        async with session.get(f"{base_url}/admin/config", headers=_auth(token)) as r:
            if r.status != 200:
                raise RouterAdminError(f"router admin GET: HTTP {r.status}")
            data = await r.json()
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        raise RouterAdminError(f"router admin GET failed: {type(exc).__name__}: {exc}") from None
    try:
        return RouterView(
            version=int(data["version"]),
            endpoints={
                e["name"]: EndpointView(
                    e["name"], str(e["state"]), int(e["num_in_flight"]), bool(e["is_healthy"])
                )
                for e in data["endpoints"]
            },
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RouterAdminError(f"router admin GET: unexpected answer: {exc!r}") from None


async def get_queue_length(session: aiohttp.ClientSession, base_url: str) -> int | None:
    """Requests the router holds for capacity (scale-from-zero demand); None if unreadable."""
    try:
        async with session.get(f"{base_url}/metrics") as r:
            if r.status != 200:
                return None
            text = await r.text()
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None
    for line in text.splitlines():
        if line.startswith(QUEUE_METRIC + " ") or line.startswith(QUEUE_METRIC + "{"):
            try:
                return int(float(line.rsplit(" ", 1)[1]))
            except ValueError:
                return None
    return None
