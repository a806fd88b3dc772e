"""The control loop, the same for every runtime: observe -> signals -> autoscaler -> reconcile
-> apply.

Each tick (twice a second) it lets the runtime reap and restart processes, reads the router's
admin view (in-flight per endpoint), and applies `reconcile`'s plan. Every
`autoscaling.intervalSeconds` it also scrapes each replica's /metrics and asks the autoscaler
for new replica counts.

Scale-down never loses a request: reconcile picks victims, the router config that marks them
draining is pushed first (and only if the push succeeds are they treated as draining), they are
stopped only once the router reports zero in flight for them or the drain timeout passes, and
the stop is a SIGTERM that the engine's own drain handles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.api.status import PoolStatus, ScaleDecision, rfc3339
from kvfleet_operator.autoscaler import History, decide
from kvfleet_operator.autoscaler_spec import config_from_pool
from kvfleet_operator.engine_args import engine_args, engine_command, engine_env
from kvfleet_operator.reconcile import Desired, Observed, ObservedReplica, reconcile
from kvfleet_operator.runtimes.router_admin import (
    RouterAdminError,
    RouterView,
    get_queue_length,
    get_view,
    put_config,
)
from kvfleet_operator.signals import ScrapeLog, Signals, aggregate, scrape

log = logging.getLogger(__name__)

IN_SERVICE = ("starting", "ready", "failed")
# A draining replica whose in-flight count we cannot read is treated as busy, so only its
# drain timeout can stop it.
UNKNOWN_IN_FLIGHT = 1 << 30
COLD_START_HOLD_S = 60.0  # how long the router holds a request for a pool scaled to zero


def prefix_hit_rate(scrapes: ScrapeLog, name: str) -> float:
    """Prefix-cache hit tokens/s over the replica's scrape log: what its warm cache is worth,
    so scale-down gives up the coldest caches first."""
    good = [s for s in scrapes.scrapes.get(name, ()) if s.sample is not None]
    if len(good) < 2 or good[-1].t <= good[0].t:
        return 0.0
    first, last = good[0].sample, good[-1].sample
    assert first is not None and last is not None
    hits = last.num_prefix_hits - first.num_prefix_hits
    return max(0.0, hits) / (good[-1].t - good[0].t)  # a restart resets the counter: 0


class Replica(Protocol):
    name: str
    role: str
    state: str  # a reconcile phase: starting | ready | failed | draining | stopping
    started_at: float
    num_restarts: int

    @property
    def address(self) -> str: ...


class FleetRuntime(Protocol):
    """What the loop needs from a runtime (processes here; Pods on Kubernetes)."""

    async def supervise(self) -> None: ...
    def replicas(self, role: str | None = None) -> Sequence[Replica]: ...
    def add_replica(
        self, role: str, argv_for: Callable[[int], list[str]], env: dict[str, str] | None = None
    ) -> Any: ...
    def mark_draining(self, name: str) -> None: ...
    def mark_ready(self, name: str) -> None: ...
    def stop_replica(self, name: str) -> None: ...


@dataclass(slots=True)
class LoopTiming:
    tick_s: float = 0.5
    scrape_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if self.tick_s <= 0 or self.scrape_timeout_s <= 0:
            raise ValueError("tick_s and scrape_timeout_s must be > 0")


class Controller:
    def __init__(
        self,
        pool: InferencePool,
        runtime: FleetRuntime,
        router_url: str,
        admin_token: str,
        *,
        history: History | None = None,
        timing: LoopTiming | None = None,
        on_event: Callable[[str], None] = lambda _msg: None,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        extra_engine_env: dict[str, str] | None = None,
    ) -> None:
        self.pool = pool
        self.runtime = runtime
        self.router_url = router_url
        self._token = admin_token
        self.timing = timing or LoopTiming()
        self.on_event = on_event
        self.clock = clock
        self.host = host
        self._extra_engine_env = dict(extra_engine_env or {})  # may hold secrets: never shown
        self.config = config_from_pool(pool.spec)
        self.history = history or History()
        self.scrapes = ScrapeLog()
        self.signals: Signals | None = None
        self.num_held = 0
        self.desired: dict[str, int] = {
            role: status.desired_replicas for role, status in pool.status.roles.items()
        }
        self.limited: dict[str, str | None] = {}
        self.decisions: dict[str, ScaleDecision] = {}
        self.router_config: dict[str, Any] | None = None  # the last one the router accepted
        self.router_view: RouterView | None = None
        self.drain_started: dict[str, float] = {}
        self._next_decision_at: float | None = None  # the first tick starts initial replicas
        self._last_push_error = ""
        self._last_tick_error = ""
        self._http: aiohttp.ClientSession | None = None

    def _on_tick_error(self, exc: Exception) -> None:
        """Report a failed tick once per distinct error; the next tick starts afresh."""
        message = f"control loop error: {type(exc).__name__}: {exc}"
        if message != self._last_tick_error:
            log.error("%s", message, exc_info=exc)
            self.on_event(message)
        self._last_tick_error = message

    @property
    def status(self) -> PoolStatus:
        return self.pool.status

    async def run(self, stop: asyncio.Event, after_tick: Callable[[], None] = lambda: None) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timing.scrape_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            self._http = http
            while not stop.is_set():
                try:
                    await self.tick()
                except Exception as exc:  # noqa: BLE001 - one bad tick must not orphan a fleet
                    self._on_tick_error(exc)
                after_tick()
                try:
                    await asyncio.wait_for(stop.wait(), self.timing.tick_s)
                except TimeoutError:
                    pass
            self._http = None

    async def tick(self) -> Desired:
        assert self._http is not None, "tick() runs inside run()"
        now = self.clock()
        await self.runtime.supervise()
        try:
            self.router_view = await get_view(self._http, self.router_url, self._token)
        except RouterAdminError:
            self.router_view = None
        if self._next_decision_at is None:
            self._next_decision_at = now + self.pool.spec.autoscaling.interval_seconds
        elif now >= self._next_decision_at:
            self._next_decision_at = now + self.pool.spec.autoscaling.interval_seconds
            await self._scrape(now)
            self._decide(now)
        return await self._reconcile_and_apply(now)

    # --- signals and the autoscaler -------------------------------------------------------

    async def _scrape(self, now: float) -> None:
        assert self._http is not None
        live = [r for r in self.runtime.replicas() if r.state in ("ready", "draining")]
        results = await asyncio.gather(
            *(
                scrape(self._http, r.name, f"{r.address}/metrics", now,
                       self.timing.scrape_timeout_s)
                for r in live
            )
        )
        for replica, result in zip(live, results, strict=True):
            self.scrapes.add(replica.name, result)
        names = {r.name for r in self.runtime.replicas()}
        for gone in set(self.scrapes.scrapes) - names:
            self.scrapes.forget(gone)
        self.scrapes.prune(now, self.config.stable_window_s)
        held = await get_queue_length(self._http, self.router_url)
        self.num_held = held or 0

    def _stale_after_s(self) -> float:
        return 2 * self.pool.spec.autoscaling.interval_seconds + self.timing.scrape_timeout_s

    def _decide(self, now: float) -> None:
        # Failed replicas count as unknown (never idle); starting ones are not measured yet.
        roles = {
            r.name: r.role for r in self.runtime.replicas() if r.state in ("ready", "failed")
        }
        # Every role gets signals, even at zero: the router's held requests are its demand.
        stable = aggregate(self.scrapes, roles, now, self.config.stable_window_s,
                           self._stale_after_s(), self.num_held, expected_roles=self.config.roles)
        panic = aggregate(self.scrapes, roles, now, self.config.panic_window_s,
                          self._stale_after_s(), self.num_held, expected_roles=self.config.roles)
        self.signals = stable
        current = self.in_service()
        decision = decide(stable, panic, current, self.config, self.history, now)
        self.history = decision.history
        self.limited = decision.limited
        wall = datetime.fromtimestamp(now, UTC)
        for role, num in decision.desired.items():
            before = current.get(role, 0)
            if num != before:
                self.on_event(f"scale {role}: {decision.reasons[role]}")
                rs = stable.roles.get(role)
                self.decisions[role] = ScaleDecision(
                    time=rfc3339(wall),
                    from_replicas=before,
                    to_replicas=num,
                    reason="ScaleUp" if num > before else "ScaleDown",
                    message=decision.reasons[role],
                    signals={
                        k: float(v)
                        for k, v in (rs.to_dict().items() if rs else [])
                        if isinstance(v, int | float)
                    },
                )
        self.desired = decision.desired

    def in_service(self) -> dict[str, int]:
        counts = {role: 0 for role in self.pool.spec.topology.roles()}
        for r in self.runtime.replicas():
            if r.state in IN_SERVICE and r.role in counts:
                counts[r.role] += 1
        return counts

    # --- reconcile and apply --------------------------------------------------------------

    def _observe(self) -> Observed:
        view = self.router_view
        replicas = []
        for r in self.runtime.replicas():
            in_flight = 0
            if view is not None and r.name in view.endpoints:
                in_flight = view.endpoints[r.name].num_in_flight
            elif view is None and r.state == "draining":
                in_flight = UNKNOWN_IN_FLIGHT
            value = prefix_hit_rate(self.scrapes, r.name)
            replicas.append(
                ObservedReplica(
                    name=r.name,
                    role=r.role,
                    phase=r.state,
                    url=r.address,
                    num_restarts=r.num_restarts,
                    num_in_flight=in_flight,
                    cached_prefix_value=value,
                    started_at=r.started_at,
                    drain_started_at=self.drain_started.get(r.name),
                )
            )
        roles = self.signals.roles.values() if self.signals else []
        return Observed(replicas, is_router_ready=view is not None,
                        num_unknown_signals=sum(rs.num_unknown for rs in roles))

    def _is_router_behind(self) -> bool:
        """The router restarted (or never got our config): push again, whatever changed."""
        return (
            self.router_view is not None
            and self.router_config is not None
            and self.router_view.version < int(self.router_config["version"])
        )

    def _with_cold_start_hold(self, config: dict[str, Any]) -> dict[str, Any]:
        """With scale to zero, a held request must outlast a cold start, not the router's
        default queue timeout. Only fills in what the reconcile core left unset."""
        if not self.pool.spec.autoscaling.scale_to_zero.enabled or "queue" in config:
            return config
        return {**config, "queue": {"timeout_s": COLD_START_HOLD_S}}

    async def _push(self, config: dict[str, Any]) -> bool:
        assert self._http is not None
        try:
            await put_config(self._http, self.router_url, self._token,
                             self._with_cold_start_hold(config))
        except RouterAdminError as exc:
            if str(exc) != self._last_push_error:
                self.on_event(f"router: {exc}")
            self._last_push_error = str(exc)
            return False
        self._last_push_error = ""
        return True

    async def _reconcile_and_apply(self, now: float) -> Desired:
        desired = reconcile(
            self.pool,
            self._observe(),
            self.desired,
            now=now,
            wall=datetime.fromtimestamp(now, UTC),
            limited=self.limited,
            decisions=self.decisions,
            previous_router_config=self.router_config,
        )
        self.pool.status = desired.status
        is_pushed = True
        if desired.is_router_config_changed or self._is_router_behind():
            is_pushed = await self._push(desired.router_config)
            if is_pushed:
                self.router_config = desired.router_config
        for role, plan in desired.roles.items():
            if is_pushed:
                for name in plan.to_undrain:
                    self.runtime.mark_ready(name)
                    self.drain_started.pop(name, None)
                    self.on_event(f"undrain {name}: needed again")
                for name in plan.to_drain:
                    self.runtime.mark_draining(name)
                    self.drain_started[name] = now
                    self.on_event(f"drain {name}: router sends it nothing new")
                for name in plan.to_stop:
                    started = self.drain_started.pop(name, None)
                    why = "" if started is None else f" after {now - started:.1f}s of drain"
                    self.runtime.stop_replica(name)
                    self.on_event(f"stop {name}{why}")
            for _ in range(plan.num_to_start):
                self._start(role)
        return desired

    def _start(self, role: str) -> None:
        spec = self.pool.spec
        command = engine_command(spec)

        def argv_for(port: int) -> list[str]:
            return command + engine_args(spec, role, host=self.host, port=port)

        self.runtime.add_replica(role, argv_for, {**engine_env(spec, role),
                                                  **self._extra_engine_env})

    # --- what `kvfleet status` shows ------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        view = self.router_view
        return {
            "desired": dict(self.desired) or self.in_service(),
            "signals": {
                role: rs.to_dict() for role, rs in (self.signals.roles.items() if self.signals
                                                   else [])
            },
            "router": {
                "config_version": self.router_config["version"] if self.router_config else 0,
                "is_reachable": view is not None,
                "num_held": self.num_held,
                "endpoints": {
                    name: {"state": e.state, "num_in_flight": e.num_in_flight,
                           "is_healthy": e.is_healthy}
                    for name, e in (view.endpoints.items() if view else [])
                },
            },
            "status": self.pool.status.to_dict(),
            "autoscaler_history": self.history.to_dict(),
        }
