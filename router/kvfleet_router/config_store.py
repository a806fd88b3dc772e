"""The config in force and the one way to replace it.

    store = ConfigStore(core)
    store.on_apply(lambda cfg: forwarder.set_timeouts(cfg.timeouts))   # wiring, in app.py
    applied = await store.push(cfg)   # False: identical re-push; raises StaleVersion

A push is serialised, versioned (higher than the current, or an identical re-push, which
is a no-op) and atomic: the routing core swaps registry and policies in one step, then
each listener (wait-queue size, forwarder timeouts, KV-event followers) follows. Requests
in flight keep the endpoint objects they hold.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.router_core import RouterCore

log = logging.getLogger(__name__)


class StaleVersion(Exception):
    def __init__(self, version: int, current: int) -> None:
        super().__init__(f"stale config version {version}; current is {current}")


class ConfigStore:
    def __init__(self, core: RouterCore) -> None:
        self._core = core
        self._lock = asyncio.Lock()
        self._listeners: list[Callable[[RouterConfig], None]] = []

    @property
    def current(self) -> RouterConfig:
        return self._core.cfg

    def endpoints(self) -> list[EndpointState]:
        """Configured plus retired-but-busy endpoints, for the admin status."""
        return self._core.registry.all_endpoints()

    def on_apply(self, listener: Callable[[RouterConfig], None]) -> None:
        self._listeners.append(listener)

    def apply(self, cfg: RouterConfig) -> None:
        """Swap in a validated config now (no version rule: a reload from the owner)."""
        self._core.apply(cfg)
        for listener in self._listeners:
            listener(cfg)
        log.info("config version %d applied (%d endpoints, policy %s)", cfg.version,
                 len(cfg.endpoints), cfg.policy.name)

    async def push(self, cfg: RouterConfig) -> bool:
        """Apply an operator's push; False for an identical re-push of the current one."""
        async with self._lock:
            current = self._core.cfg
            if cfg.version == current.version and cfg.to_dict() == current.to_dict():
                return False
            if cfg.version <= current.version:
                raise StaleVersion(cfg.version, current.version)
            self.apply(cfg)
            return True
