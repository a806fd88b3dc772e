"""The control loop, the same for every runtime: observe -> scrape -> decide -> reconcile ->
push the router config -> apply.

Each `tick()` lets the runtime supervise its replicas, reads every router's view (in-flight
per endpoint, summed), and applies `reconcile`'s plan. Every `autoscaling.intervalSeconds`
it also samples each replica's metrics and asks the scaler for new replica counts.

Scale-down never loses a request: reconcile picks victims; the router config that marks
them draining is pushed to every router first, and only if all accepted it are they
marked draining (a failed push leaves every victim serving); they are deleted only once no
router reports anything in flight for them, or their drain timeout has passed (drain start
times live in the state store, so a restarted loop does not restart the timer); deletion
lets the engine finish what it still holds. Config versions only grow: the next one is
numbered from the last the store recorded, or from the newest any router runs if that is
higher (a loop killed between a push and its save).

`kvfleet up` runs it over local processes (`runtimes/local*.py`); `kvfleet sim` runs the same
`tick()` in virtual time (`kvfleet_sim.ports`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kvfleet_router.perf_model import RoleCoefficients

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.api.status import ScaleDecision
from kvfleet_operator.decide.autoscaler import Decision, History, decide
from kvfleet_operator.decide.autoscaler_spec import config_from_pool
from kvfleet_operator.decide.reconcile import Desired, pool_sizes, reconcile
from kvfleet_operator.decide.role_signals import ScrapeLog, Signals, aggregate
from kvfleet_operator.decide.rollout import (
    Presence,
    RolloutDecision,
    RolloutState,
    revision_of,
    step_rollout,
)
from kvfleet_operator.loop import events as ev
from kvfleet_operator.loop.observe import (
    IN_SERVICE,
    UNKNOWN_IN_FLIGHT,
    StartupLog,
    current_replicas,
    decision_roles,
    fill_pending,
    observe,
    scale_decisions,
    stale_after_s,
)
from kvfleet_operator.loop.ports import (
    Clock,
    EventSink,
    MetricsSource,
    PortUnavailable,
    Replica,
    ReplicaRuntime,
    RouterControl,
    RouterControlError,
    RouterView,
    StateStore,
)
from kvfleet_operator.loop.state import LoopState

log = logging.getLogger(__name__)

DELETE_GRACE_EXTRA_S = 10.0  # beyond the drain timeout, for the engine's own SIGTERM drain


class Scaler(Protocol):
    """(stable signals, panic signals, current replicas, history, now) -> Decision."""

    def __call__(
        self, stable: Signals, panic: Signals, current: dict[str, int], history: History,
        now: float,
    ) -> Decision: ...  # fmt: skip


def pool_autoscaler(pool: InferencePool) -> Scaler:
    """kvfleet's autoscaler with the pool's own settings: the default scaler."""
    config = config_from_pool(pool.spec)

    def scaler(stable: Signals, panic: Signals, current: dict[str, int], history: History,
               now: float) -> Decision:  # fmt: skip
        return decide(stable, panic, current, config, history, now)

    return scaler


@dataclass(slots=True)
class LoopTiming:
    tick_s: float = 0.5
    scrape_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if self.tick_s <= 0 or self.scrape_timeout_s <= 0:
            raise ValueError("tick_s and scrape_timeout_s must be > 0")


@dataclass(slots=True)
class TickResult:
    desired: Desired
    decision: Decision | None  # set on ticks where the scaler was asked


class ControlLoop:
    def __init__(
        self,
        pool: InferencePool,
        *,
        runtime: ReplicaRuntime,
        router: RouterControl,
        metrics: MetricsSource,
        store: StateStore,
        events: EventSink,
        clock: Clock = time.time,
        timing: LoopTiming | None = None,
        scaler: Scaler | None = None,
        router_peers_dns: str = "",  # the runtime's name for every router pod (exchange)
    ) -> None:
        self.pool = pool
        self.router_peers_dns = router_peers_dns
        self.runtime = runtime
        self.router = router
        self.metrics = metrics
        self.store = store
        self.events = events
        self.clock = clock
        self.timing = timing or LoopTiming()
        self.config = config_from_pool(pool.spec)
        self.scaler = scaler or pool_autoscaler(pool)
        saved = store.load()
        if saved is not None:
            pool.status = saved.status
        self.state = saved.loop if saved is not None else LoopState()
        if not self.state.desired:
            self.state.desired = {
                role: status.desired_replicas for role, status in pool.status.roles.items()
            }
        self.scrapes = ScrapeLog()
        self.startups = StartupLog()  # start-ups measured here, and who is not ready since when
        self.signals: Signals | None = None
        self.view: RouterView | None = None
        self.num_held = 0
        self.perf_models: dict[str, RoleCoefficients] = {}  # the routers' perf-model fits
        self._next_decision_at: float | None = None  # the first tick starts initial replicas
        self._last_push_error = ""
        self._last_tick_error = ""
        self._last_floor_message = ""
        # A revision promoted by hand (the Kubernetes annotation, `kvfleet rollout promote`):
        # the runtime sets it; a value that is not the canary's revision is ignored.
        self.promote_revision: str | None = None
        self._is_default_scaler = scaler is None

    def replace_spec(self, spec: PoolSpec) -> None:
        """The pool's spec changed while the loop runs (`kvfleet up` saw its file edited):
        the next tick reconciles toward it, and a new engine template rolls out by
        `spec.rollout`. What the loop has measured (scrapes, start-ups) carries over."""
        self.pool.spec = spec
        self.pool.generation += 1
        self.config = config_from_pool(spec)
        if self._is_default_scaler:
            self.scaler = pool_autoscaler(self.pool)

    async def run(self, stop: asyncio.Event, after_tick: Callable[[], None] = lambda: None) -> None:
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

    def _on_tick_error(self, exc: Exception) -> None:
        """Report a failed tick once per distinct error; the next tick starts afresh."""
        message = f"control loop error: {type(exc).__name__}: {exc}"
        if message != self._last_tick_error:
            log.error("%s", message, exc_info=None if isinstance(exc, PortUnavailable) else exc)
            self.events.emit(ev.warning(ev.EventReason.LOOP_ERROR, message))
        self._last_tick_error = message

    async def tick(self) -> TickResult:
        now = self.clock()
        await self.runtime.supervise()
        self.startups.update(self.runtime.replicas(), now)
        self.view = await self.router.view()
        decision: Decision | None = None
        decisions: dict[str, ScaleDecision] = {}
        interval = self.pool.spec.autoscaling.interval_seconds
        if self._next_decision_at is None:
            self._next_decision_at = now + interval
        elif now >= self._next_decision_at:
            self._next_decision_at = now + interval
            await self._sample(now)
            decision, decisions = self._decide(now)
        desired = await self._reconcile_and_apply(now, decisions)
        self.startups.update(self.runtime.replicas(), now)  # new replicas: their start-up
        await self.store.save(self.pool.status, self.state, self.snapshot())
        return TickResult(desired, decision)

    # --- signals and the scaler -----------------------------------------------------------

    async def _sample(self, now: float) -> None:
        replicas = self.runtime.replicas()
        live = [r for r in replicas if r.state in ("ready", "draining")]
        for name, scrape in (await self.metrics.sample(live, now)).items():
            self.scrapes.add(name, scrape)
        for gone in set(self.scrapes.scrapes) - {r.name for r in replicas}:
            self.scrapes.forget(gone)
        self.scrapes.prune(now, self.config.stable_window_s)
        self.num_held = await self.router.num_held()
        self.perf_models = await self.router.perf_models()

    def _decide(self, now: float) -> tuple[Decision, dict[str, ScaleDecision]]:
        replicas = self.runtime.replicas()
        roles = decision_roles(replicas)
        stale = stale_after_s(self.pool.spec.autoscaling.interval_seconds,
                              self.timing.scrape_timeout_s)  # fmt: skip
        # Every role gets signals, even at zero: the router's held requests are its demand.
        stable, panic = (
            aggregate(self.scrapes, roles, now, window, stale, self.num_held,
                      expected_roles=self.config.roles, perf_models=self.perf_models)  # fmt: skip
            for window in (self.config.stable_window_s, self.config.panic_window_s)
        )
        for signals in (stable, panic):  # replicas not ready past their start-up allowance
            fill_pending(signals, replicas, self.startups, now)
        self.signals = stable
        current = current_replicas(self.pool.spec, replicas)
        if self.state.rollout is not None and self.state.rollout.canary:
            # Two revisions side by side: the scaler sizes the pool as a whole, which is
            # what it last asked for, not the sum of both revisions' replicas.
            current = pool_sizes(self.pool.spec, self.state.desired, self.pool.status)
        decision = self.scaler(stable, panic, current, self.state.history, now)
        self.state.history = decision.history
        self.state.limited = {
            role: f"{why}: {decision.details[role]}" if why and decision.details.get(role) else why
            for role, why in decision.limited.items()
        }
        self.state.desired = dict(decision.desired)
        decisions = scale_decisions(decision, current, stable, datetime.fromtimestamp(now, UTC))
        for role, made in decisions.items():
            self.events.emit(ev.normal(made.reason, f"scale {role}: {made.message}"))
        return decision, decisions

    # --- reconcile and apply --------------------------------------------------------------

    def _is_router_behind(self) -> bool:
        """A router restarted (or never got our config): push again, whatever changed."""
        pushed = self.state.router_config
        return (
            self.view is not None
            and pushed is not None
            and self.view.version < int(pushed["version"])
        )

    async def _push(self, config: dict[str, Any]) -> bool:
        try:
            await self.router.push(config)
        except RouterControlError as exc:
            if str(exc) != self._last_push_error:
                self.events.emit(ev.warning(ev.EventReason.ROUTER_PUSH_FAILED, f"router: {exc}"))
            self._last_push_error = str(exc)
            return False
        self._last_push_error = ""
        self.state.router_config = config
        return True

    def _version_floor(self, pushed: dict[str, Any] | None) -> dict[str, Any] | None:
        """The config to version the next one from. A router running a newer version than
        the last one this loop recorded (the loop was killed between a push and its save,
        or its state was lost) would refuse ours as stale, or keep its own as an "identical"
        re-push: the next config then goes above the routers' newest, never back."""
        mine = int(pushed["version"]) if pushed is not None else 0
        if self.view is None or self.view.max_version <= mine:
            return pushed
        message = (f"routers run config version {self.view.max_version}, newer than the "
                   f"last this loop recorded ({mine or 'none'}): the next goes above it")
        if message != self._last_floor_message:
            self.events.emit(ev.warning(ev.EventReason.ROUTER_VERSION_AHEAD, message))
        self._last_floor_message = message
        return {"version": self.view.max_version}  # no content: whatever comes is a change

    async def _reconcile_and_apply(
        self, now: float, decisions: dict[str, ScaleDecision]
    ) -> Desired:
        state = self.state
        replicas = self.runtime.replicas()
        # A replica the runtime reports draining on its own (a Kubernetes rollout's victim):
        # its drain starts now, and no router has been told yet, so their counts vouch for
        # nothing until a view taken after this tick's push.
        fresh = {r.name for r in replicas
                 if r.state == "draining" and r.name not in state.drain_started}  # fmt: skip
        for name in fresh:
            state.drain_started[name] = now
        rollout = self._step_rollout(now, replicas, await self._rollout_query())
        observed = observe(replicas, self.view, self.scrapes, state.drain_started,
                           self.signals, self.startups.overdue(now))  # fmt: skip
        for replica in observed.replicas:  # a replica that names no revision is the stable's
            replica.revision = replica.revision or rollout.state.stable
        previous = self._version_floor(state.router_config)
        for replica in observed.replicas:
            if replica.name in fresh:
                replica.num_in_flight = UNKNOWN_IN_FLIGHT
        desired = reconcile(
            self.pool,
            observed,
            state.desired,
            now=now,
            wall=datetime.fromtimestamp(now, UTC),
            limited=state.limited,
            decisions=decisions,
            previous_router_config=previous,
            rollout=rollout,
            router_peers_dns=self.router_peers_dns,
        )
        self.pool.status = desired.status
        in_flight = {r.name: r.num_in_flight for r in observed.replicas}
        is_pushed = True
        if desired.is_router_config_changed or self._is_router_behind():
            is_pushed = await self._push(desired.router_config)
        grace_s = self.pool.spec.autoscaling.drain_timeout_seconds + DELETE_GRACE_EXTRA_S
        for plan in desired.plans:
            if is_pushed:  # the routers know: only now may replicas change state
                for name in plan.to_undrain:
                    await self.runtime.mark_ready(name)
                    state.drain_started.pop(name, None)
                    self.events.emit(ev.normal(ev.EventReason.REPLICA_UNDRAINED,
                                               f"undrain {name}: needed again"))  # fmt: skip
                for name in plan.to_drain:
                    await self.runtime.mark_draining(name)
                    state.drain_started[name] = now
                    self.events.emit(ev.normal(ev.EventReason.REPLICA_DRAINING,
                                               f"drain {name}: router sends it nothing new"))
                for name in plan.to_stop:
                    started = state.drain_started.pop(name, None)
                    why = "" if started is None else f" after {now - started:.1f}s of drain"
                    await self.runtime.delete(name, grace_s)
                    busy = in_flight.get(name, 0)
                    if started is not None and busy:  # the drain timeout, not an empty replica
                        self.events.emit(ev.warning(
                            ev.EventReason.DRAIN_TIMED_OUT,
                            f"stop {name}{why}: drain timeout with "
                            f"{'unknown' if busy >= UNKNOWN_IN_FLIGHT else busy} in flight",
                        ))  # fmt: skip
                    else:
                        self.events.emit(ev.normal(ev.EventReason.REPLICA_STOPPING,
                                                   f"stop {name}{why}"))  # fmt: skip
            for _ in range(plan.num_to_start):
                await self.runtime.create(rollout.specs.get(plan.revision, self.pool.spec), plan)
        names = {r.name for r in self.runtime.replicas()}
        for gone in set(state.drain_started) - names:
            del state.drain_started[gone]
        return desired

    async def _rollout_query(self) -> float | None:
        """The analysis' own PromQL query, asked only while a rollout runs, of a metrics
        source that can answer one (Prometheus); None otherwise (the check then fails)."""
        query = self.pool.spec.rollout.analysis.query
        ask = getattr(self.metrics, "query_value", None)
        if query is None or ask is None or not (self.state.rollout and self.state.rollout.canary):
            return None
        value: float | None = await ask(query.promql)
        return value

    def _step_rollout(self, now: float, replicas: Sequence[Replica],
                      query_value: float | None = None) -> RolloutDecision:
        """The rollout's tick: which revisions run, how many of each, and their weights."""
        state = self.state.rollout or RolloutState()
        stable = state.stable or revision_of(self.pool.spec)
        presence: dict[str, dict[str, Presence]] = {}
        for r in replicas:
            roles = presence.setdefault(r.revision or stable, {})
            seen = roles.get(r.role, Presence())
            roles[r.role] = Presence(seen.in_service + (r.state in IN_SERVICE),
                                     seen.ready + (r.state == "ready"))  # fmt: skip
        decision = step_rollout(
            self.pool.spec, state, presence,
            pool_sizes(self.pool.spec, self.state.desired, self.pool.status),
            self.view.revisions if self.view is not None else None,
            now=now, wall=datetime.fromtimestamp(now, UTC),
            handles_rolling=getattr(self.runtime, "handles_rolling", False),
            promote=self.promote_revision or self.pool.promote_revision,
            query_value=query_value,
        )  # fmt: skip
        self.state.rollout = decision.state
        for kind, reason, message in decision.events:
            self.events.emit(ev.Event(kind, reason, message))
        return decision

    # --- what `kvfleet status` shows ------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        view = self.view
        pushed = self.state.router_config
        return {
            "desired": dict(self.state.desired)
            or current_replicas(self.pool.spec, self.runtime.replicas()),
            "signals": {
                role: rs.to_dict() for role, rs in (self.signals.roles.items() if self.signals
                                                   else [])
            },
            "router": {
                "config_version": pushed["version"] if pushed else 0,
                "is_reachable": view is not None,
                "num_held": self.num_held,
                "endpoints": {
                    name: {"state": e.state, "num_in_flight": e.num_in_flight,
                           "is_healthy": e.is_healthy}
                    for name, e in (view.endpoints.items() if view else [])
                },
            },
            "autoscaler_history": self.state.history.to_dict(),
        }
