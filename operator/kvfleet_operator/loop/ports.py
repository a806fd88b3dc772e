"""The ports of the control loop: what a runtime implements so that the loop runs on it.

Local processes (`runtimes/local/`), Kubernetes (`runtimes/kubernetes/ports/`) and the
simulator's virtual time (`kvfleet_sim.ports`) implement these; none of them re-implements
the loop. Methods that
may do I/O are async; a virtual-time implementation simply never suspends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvfleet_router.perf_model import RoleCoefficients
from kvfleet_router.revision_stats import RevisionCounts

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.api.status import PoolStatus
from kvfleet_operator.decide.reconcile import RolePlan
from kvfleet_operator.decide.role_signals import Scrape
from kvfleet_operator.loop.events import EventSink as EventSink  # a port, defined with Event
from kvfleet_operator.loop.state import LoopState

Clock = Callable[[], float]  # seconds; the same clock stamps drains, scrapes and decisions


class Replica(Protocol):
    """One engine replica as its runtime sees it."""

    @property
    def name(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def state(self) -> str: ...  # a reconcile phase: starting|ready|failed|draining|stopping
    @property
    def address(self) -> str: ...  # http://host:port
    @property
    def started_at(self) -> float: ...
    @property
    def num_restarts(self) -> int: ...
    @property
    def last_error(self) -> str: ...  # why it last failed (its one-line reason), or ""
    @property
    def revision(self) -> str: ...  # the engine template it runs (`decide.rollout.revision_of`)


class ReplicaRuntime(Protocol):
    async def supervise(self) -> None:
        """Reap exits, restart crashes, promote healthy starters to ready."""

    def replicas(self) -> Sequence[Replica]: ...

    async def create(self, spec: PoolSpec, plan: RolePlan) -> None:
        """Start one more replica of `plan.role` and `plan.revision`, from that revision's
        spec and the plan (during a rollout `spec` may be the stable revision's, not the
        pool's current one)."""

    async def mark_draining(self, name: str) -> None: ...
    async def mark_ready(self, name: str) -> None: ...

    async def delete(self, name: str, grace_s: float) -> None:
        """Stop a replica the router no longer sends to: it finishes what it holds, and is
        killed after `grace_s`."""


@dataclass(slots=True)
class EndpointView:
    name: str
    state: str
    num_in_flight: int
    is_healthy: bool


@dataclass(slots=True)
class RouterView:
    """What every router replica reports, combined: `version` is the oldest config any of
    them runs, `newest_version` the newest (None: the same), `num_in_flight` is summed
    across them."""

    version: int
    endpoints: dict[str, EndpointView] = field(default_factory=dict)
    newest_version: int | None = None
    # Per engine revision, what the routers measured since they started (summed).
    revisions: dict[str, RevisionCounts] = field(default_factory=dict)

    @property
    def max_version(self) -> int:
        return self.version if self.newest_version is None else self.newest_version


class PortUnavailable(Exception):
    """A port's outside world did not answer or refused (an API server timing out, say):
    expected now and then, so the loop reports it in one line, without a traceback."""


class RouterControlError(RuntimeError):
    """A router replica did not accept or answer; the message says which and why."""


class RouterControl(Protocol):
    async def push(self, config: dict[str, Any]) -> None:
        """Push a config to every router replica; raises RouterControlError unless all
        accepted it."""

    async def view(self) -> RouterView | None:
        """Every router's view combined, or None when any router cannot be read (then
        nobody knows what is in flight)."""

    async def num_held(self) -> int:
        """Requests the routers hold for capacity (scale-from-zero demand), summed."""

    async def perf_models(self) -> dict[str, RoleCoefficients]:
        """Role -> the routers' perf-model fit (`role_signals.combine_perf_models` over
        every router that answered; a role with no fit yet is absent)."""


class MetricsSource(Protocol):
    async def sample(self, replicas: Sequence[Replica], now: float) -> dict[str, Scrape]:
        """One `Scrape` per replica (a failure is a Scrape without a sample)."""


@dataclass(slots=True)
class Saved:
    status: PoolStatus
    loop: LoopState


class StateStore(Protocol):
    def load(self) -> Saved | None:
        """What the last run saved for this pool, or None."""

    async def save(self, status: PoolStatus, loop: LoopState, view: dict[str, Any]) -> None:
        """Persist status and loop state after a tick; `view` is what `status` commands show
        besides (signals, router endpoints)."""


