"""In-memory ports for the control loop: replicas, routers, metrics, state and events that
a test steers by hand, with a clock it moves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvfleet_operator.decide.autoscaler import Decision, History
from kvfleet_operator.decide.role_signals import ReplicaSample, Scrape
from kvfleet_operator.loop.events import Event
from kvfleet_operator.loop.ports import (
    EndpointView,
    RouterControlError,
    RouterView,
    Saved,
)


@dataclass
class FakeReplica:
    name: str
    role: str
    state: str = "starting"
    started_at: float = 0.0
    num_restarts: int = 0
    address: str = ""
    last_error: str = ""
    revision: str = ""

    def __post_init__(self) -> None:
        self.address = self.address or f"http://fake.{self.name}:8000"


class FakeRuntime:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.by_name: dict[str, FakeReplica] = {}
        self.deleted: list[str] = []
        self._next = 0

    async def supervise(self) -> None:
        for r in self.by_name.values():
            if r.state == "starting":
                r.state = "ready"

    def replicas(self) -> list[FakeReplica]:
        return list(self.by_name.values())

    async def create(self, spec: Any, plan: Any) -> None:
        name = f"{plan.role}-{self._next}"
        self._next += 1
        self.by_name[name] = FakeReplica(name, plan.role, started_at=self.clock(),
                                         revision=plan.revision)

    async def mark_draining(self, name: str) -> None:
        self.by_name[name].state = "draining"

    async def mark_ready(self, name: str) -> None:
        self.by_name[name].state = "ready"

    async def delete(self, name: str, grace_s: float) -> None:
        del self.by_name[name]
        self.deleted.append(name)

    def states(self) -> dict[str, str]:
        return {n: r.state for n, r in self.by_name.items()}


class FakeRouters:
    """Several router replicas: a push fails unless every one is up."""

    def __init__(self, num_routers: int = 2) -> None:
        self.is_up = [True] * num_routers
        self.configs: list[dict[str, Any] | None] = [None] * num_routers
        self.in_flight: dict[str, int] = {}  # per endpoint, summed over routers
        self.held = 0
        self.is_view_broken = False  # pushes work, reading in-flight does not
        self.fits: dict[str, Any] = {}  # role -> RoleCoefficients the routers export

    async def push(self, config: dict[str, Any]) -> None:
        for i, up in enumerate(self.is_up):
            if up:
                self.configs[i] = config
        down = [i for i, up in enumerate(self.is_up) if not up]
        if down:
            raise RouterControlError(f"router(s) {down} unreachable")

    async def view(self) -> RouterView | None:
        if self.is_view_broken or not all(self.is_up) or any(c is None for c in self.configs):
            return None
        versions = [int(c["version"]) for c in self.configs if c is not None]
        first = self.configs[0]
        assert first is not None
        return RouterView(min(versions), {
            e["name"]: EndpointView(e["name"], e["state"], self.in_flight.get(e["name"], 0), True)
            for e in first["endpoints"]
        })  # fmt: skip

    async def num_held(self) -> int:
        return self.held

    async def perf_models(self) -> dict[str, Any]:
        return dict(self.fits)


class FakeMetrics:
    def __init__(self) -> None:
        self.replica_sample = ReplicaSample(num_running=1.0)

    async def sample(self, replicas: Any, now: float) -> dict[str, Scrape]:
        return {r.name: Scrape(now, self.replica_sample) for r in replicas}


@dataclass
class MemoryStore:
    saved: Saved | None = None
    num_saves: int = 0

    def load(self) -> Saved | None:
        return self.saved

    async def save(self, status: Any, loop: Any, view: dict[str, Any]) -> None:
        # Through JSON, as a real store would: what does not serialise does not survive.
        from kvfleet_operator.api.status import parse_status
        from kvfleet_operator.loop.state import LoopState

        self.saved = Saved(parse_status(status.to_dict()), LoopState.from_dict(loop.to_dict()))
        self.num_saves += 1


@dataclass
class Events:
    events: list[Event] = field(default_factory=list)

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


@dataclass
class FakeClock:
    t: float = 1000.0

    def __call__(self) -> float:
        return self.t


class SteeredScaler:
    """A scaler that asks for whatever the test sets, through the same Decision type."""

    def __init__(self, desired: dict[str, int]) -> None:
        self.desired = dict(desired)

    def __call__(self, stable: Any, panic: Any, current: dict[str, int], history: History,
                 now: float) -> Decision:  # fmt: skip
        history.decisions.append({"t": now, "desired": dict(self.desired)})
        reasons = {r: f"steered {current.get(r, 0)}->{n}" for r, n in self.desired.items()}
        return Decision(dict(self.desired), reasons, {}, history)
