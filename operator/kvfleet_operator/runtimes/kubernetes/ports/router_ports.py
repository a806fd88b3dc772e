"""The loop's `RouterControl` port on Kubernetes: `HttpRouterControl` over every router
pod's IP, re-read each tick (router pods come and go; with sidecars every engine pod is
one). No router pod running: no view (nobody can vouch for in-flight), and a push fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
from kvfleet_router.perf_model import RoleCoefficients

from kvfleet_operator.loop.ports import RouterControlError, RouterView
from kvfleet_operator.runtimes.router_control import HttpRouterControl


class PodRouterControl:
    def __init__(
        self, session: aiohttp.ClientSession, urls: Callable[[], list[str]], token: str
    ) -> None:
        self._session = session
        self._urls = urls
        self._token = token  # never logged

    def _routers(self) -> HttpRouterControl | None:
        urls = self._urls()
        return HttpRouterControl(self._session, urls, self._token) if urls else None

    async def push(self, config: dict[str, Any]) -> None:
        routers = self._routers()
        if routers is None:
            raise RouterControlError("no router pod is running")
        await routers.push(config)

    async def view(self) -> RouterView | None:
        routers = self._routers()
        return await routers.view() if routers is not None else None

    async def num_held(self) -> int:
        routers = self._routers()
        return await routers.num_held() if routers is not None else 0

    async def perf_models(self) -> dict[str, RoleCoefficients]:
        routers = self._routers()
        return await routers.perf_models() if routers is not None else {}
