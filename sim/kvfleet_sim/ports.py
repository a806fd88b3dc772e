"""The control loop's ports in virtual time: the simulator runs the same `ControlLoop.tick()`
that `kvfleet up` runs, over these instead of processes and HTTP.

- `SimClock`: the virtual now, shared by the loop and the data plane.
- `SimRuntime`: replicas are `SimReplica`s; start-up takes `startup_s` of virtual time
  (a fleet provisioned before the trace starts is ready at once); a deleted replica leaves
  the router, finishes what it holds, and is cut off after its grace period. A replica runs
  the cost profile of the spec it is created from (`engine.profile`: a rollout's new
  revision may name another), slowed by `slowdowns[revision]` when the scenario says so.
- `SimRouter`: the router's own `RouterCore` (registry, prefix indexes, policies) behind
  its `ConfigStore`: `push` goes through `ConfigStore.push`, the code path of an admin PUT
  (versions only go up); its view is what `GET /admin/config` lists (retired endpoints
  with in-flight requests included); held requests wait in its flow control, the router's
  own pure pieces (`flow/`): the bounded `FairQueue` over `AttainedService` (bands, then
  weighted least attained service between tenants, then FCFS inside a tenant) and the
  `FlowGate` (seats, standings, saturation), sized from each pushed config's `queue` and
  `flow_control` as the router's app sizes its `WaitQueue`; its `HealthFeedback` learns
  from every finished exchange, as the dispatcher's does; `perf_models` hands the
  autoscaler the perf-model fits a live router exports on /metrics. A rollout's traffic
  split is the router's own `RevisionSplit` (revisions.py), configured from each push as the
  dispatcher configures it; each upstream attempt's outcome, TTFT and ITL go to the router's
  `RevisionMeter`, and `view()` answers them in `RouterView.revisions`, as `GET
  /admin/config` does, so the loop's rollout analysis runs in virtual time.
- `SimMetrics`: a replica's engine stats read directly (no network, never stale).
- `SimStore` keeps state in memory; `SimEvents` records every event with its time.
- `drive(coro)`: run a coroutine that never suspends (every port here is synchronous).
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.runners.cost_model import CostProfile, load_profile
from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.api.status import PoolStatus
from kvfleet_operator.decide.reconcile import RolePlan
from kvfleet_operator.decide.role_signals import Scrape
from kvfleet_operator.loop.events import Event
from kvfleet_operator.loop.ports import EndpointView, Replica, RouterView, Saved
from kvfleet_operator.loop.state import LoopState
from kvfleet_router.config import FlowControlConfig, RouterConfig
from kvfleet_router.config_store import ConfigStore
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.flow.fair_queue import FairQueue, Ticket
from kvfleet_router.flow.gate import FlowGate
from kvfleet_router.flow.seats import Seat
from kvfleet_router.flow.service import AttainedService
from kvfleet_router.flow.tenants import Flow, TenantLabels, request_flow
from kvfleet_router.metrics import RouterMetrics, perf_models
from kvfleet_router.perf_model import RoleCoefficients
from kvfleet_router.quota import QuotaBook
from kvfleet_router.revision_stats import RevisionCounts
from kvfleet_router.revisions import RevisionMeter, RevisionSplit
from kvfleet_router.router_core import RouterCore

from kvfleet_sim.fake_backend import FakeBackendModel
from kvfleet_sim.replica import Finished, SimReplica

T = TypeVar("T")

# A slower build's cost profile: every time coefficient times the slowdown factor.
SCALED_COSTS = ("overhead_s", "floor_s", "prefill_s_per_token", "decode_s_per_seq",
                "s_per_kv_token", "prefill_s_per_pair")


def drive(coro: Coroutine[Any, Any, T]) -> T:
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a simulated port suspended; virtual-time ports must not await I/O")


@dataclass(slots=True)
class SimClock:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


class SimRuntime:
    def __init__(self, config: EngineConfig, profile: str, startup_s: float, measure_from_s: float,
                 clock: SimClock, schedule: Callable[[float, str, str], None],
                 profiles: tuple[str, ...] = (),
                 fake: FakeBackendModel | None = None) -> None:  # fmt: skip
        self.config = config
        self.fake = fake  # replicas are the router benchmark's fake backends
        self.profile = profile
        self.profiles = profiles  # mixed speeds: replica k takes profiles[k mod len]
        self.startup_s = startup_s
        self.measure_from_s = measure_from_s
        self.clock = clock
        self.schedule = schedule  # (t, kind, replica name): the fleet's event queue
        self.by_name: dict[str, SimReplica] = {}
        self.is_provisioned_before_start = True  # until the trace starts
        self.retired: list[tuple[SimReplica, float]] = []  # (replica, when it stopped)
        self.cut_off: list[Finished] = []  # requests still running when a grace period ended
        self._next_id = 0
        # A rollout scenario's slower build: revision -> factor on every step time.
        self.slowdowns: dict[str, float] = {}
        # The engine config of a spec (`fleet.engine_config_of`); None: `config` for all.
        self.config_of: Callable[[PoolSpec], EngineConfig] | None = None
        # Where each inter-token gap goes, with its replica's revision (the router's meter).
        self.on_itl: Callable[[str, float], None] | None = None
        self._costs: dict[tuple[str, float], CostProfile] = {}

    def profile_of(self, spec: PoolSpec, revision: str) -> str | CostProfile:
        """The cost profile a replica of `spec` runs: the spec's `engine.profile` (the
        mixed-speed `profiles` stand in for the pool's own profile only), slowed by the
        revision's factor."""
        named = spec.engine.profile or self.profile
        if self.profiles and named == self.profile:
            named = self.profiles[(self._next_id - 1) % len(self.profiles)]
        factor = self.slowdowns.get(revision, 1.0)
        if factor == 1.0:
            return named
        key = (named, factor)
        if key not in self._costs:
            base = load_profile(named)
            self._costs[key] = dataclasses.replace(
                base, name=f"{base.name} x{factor:g}",
                **{f: getattr(base, f) * factor for f in SCALED_COSTS})
        return self._costs[key]

    async def supervise(self) -> None:
        now = self.clock()
        for r in self.by_name.values():
            if r.state == "starting" and now >= r.ready_at:
                r.state = "ready"

    def replicas(self) -> Sequence[Replica]:
        return list(self.by_name.values())

    async def create(self, spec: PoolSpec, plan: RolePlan) -> None:
        now = self.clock()
        ready_at = now if self.is_provisioned_before_start else now + self.startup_s
        name = f"{plan.role}-{self._next_id}"
        self._next_id += 1
        profile = self.profile_of(spec, plan.revision)
        config = self.config_of(spec) if self.config_of is not None else self.config
        replica = SimReplica(name, config, profile, now, ready_at, self.measure_from_s,
                             role=plan.role, fake=self.fake, now=self.clock)  # fmt: skip
        replica.state = "ready" if ready_at <= now else "starting"
        replica.revision = plan.revision
        if self.on_itl is not None:
            replica.on_itl = functools.partial(self.on_itl, plan.revision)
        self.by_name[name] = replica

    async def mark_draining(self, name: str) -> None:
        self.by_name[name].state = "draining"

    async def mark_ready(self, name: str) -> None:
        self.by_name[name].state = "ready"

    async def delete(self, name: str, grace_s: float) -> None:
        replica = self.by_name[name]
        replica.state = "stopping"
        if replica.engine.has_unfinished_requests():
            self.schedule(self.clock() + grace_s, "kill", name)
        else:
            self.remove(name)

    def remove(self, name: str) -> None:
        replica = self.by_name.pop(name, None)
        if replica is not None:
            self.retired.append((replica, self.clock()))

    def kill(self, name: str) -> list[Finished]:
        """The grace period is over: what is still running is cut off (counted as failed)."""
        replica = self.by_name.get(name)
        if replica is None or replica.state != "stopping":
            return []
        cut = replica.abort_all(self.clock())
        self.cut_off += cut
        self.remove(name)
        return cut


@dataclass(slots=True)
class HeldRequest:
    request_id: str
    prompt: list[int]
    num_output: int
    arrival: float
    tenant: str = "default"
    priority: int = 0  # the request's own (the trace's), lower first
    # set by flow control: its standing, its ticket while queued, its seat once dispatched
    flow: Flow | None = None
    ticket: Ticket | None = None
    seat: Seat | None = None
    num_charged_output: int = 0  # output tokens charged at dispatch (max_tokens)
    quota_charged: int = 0  # tokens charged against its tenant's TPM, settled at the end
    # a rollout's split: the revision assigned at arrival (None: no split), and when the
    # leg that streams the answer was sent (the router's TTFT for that revision runs from it)
    revision: str | None = None
    sent_at: float = 0.0


class SimRouter:
    """One router replica in virtual time: the production routing core, configured through
    the production config store. `prefix_mode` (when set) overrides every endpoint's
    `prefix_mode` in a pushed config, so precise KV-event indexing can be simulated although
    the operator's router config asks for approximate; `capacity` (when set) every
    endpoint's in-flight cap (the operator's is twice the batch)."""

    def __init__(self, seed: int, sees_held: bool = True, prefix_mode: str | None = None,
                 capacity: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.core = RouterCore(RouterConfig.from_dict({"version": 0}), rng=self.rng)
        self.store = ConfigStore(self.core)
        metrics = RouterMetrics(lambda: self.core, lambda: len(self.held))
        self.feedback = HealthFeedback(metrics, lambda: self.core.cfg)
        cfg = self.core.cfg
        self.service = AttainedService(cfg.flow_control.service_window_s)
        self.queue = FairQueue(cfg.queue.max_size, self.service, cfg.flow_control.band_bound)
        self.gate = FlowGate(self.service)
        self.quotas = QuotaBook(cfg.quotas)  # per-tenant RPM/TPM (the HTTP front's gate)
        self.labels = TenantLabels(cfg.flow_control.max_tenant_labels)
        self.held: dict[str, HeldRequest] = {}  # request id -> a request in the queue
        self.by_ticket: dict[Ticket, HeldRequest] = {}
        self.sees_held = sees_held  # whether the scaler is told about held requests
        self.prefix_mode = prefix_mode
        self.capacity = capacity  # each endpoint's in-flight cap instead of the operator's
        self.on_config: Callable[[], None] = lambda: None  # the fleet re-dispatches held ones
        # runs after each push (which rebuilds the core's policies): a model of a peer
        # router's rule takes a policy's place (sgl_rule.SglRule)
        self.after_push: Callable[[RouterCore], None] | None = None
        self.split = RevisionSplit()  # a rollout's traffic split (the dispatcher's)
        self.meter = RevisionMeter()  # per-revision outcomes and latencies (the forwarder's)
        self.forgotten: dict[str, RevisionCounts] = {}  # what the meter dropped, for reports

    @property
    def endpoints(self) -> dict[str, EndpointState]:
        return self.core.registry.by_name

    @property
    def version(self) -> int:
        return self.core.cfg.version

    async def push(self, config: dict[str, Any]) -> None:
        if self.prefix_mode is not None:
            config = {**config, "endpoints": [{**e, "prefix_mode": self.prefix_mode}
                                              for e in config.get("endpoints", [])]}
        if self.capacity is not None:
            config = {**config, "endpoints": [{**e, "capacity": self.capacity}
                                              for e in config.get("endpoints", [])]}
        await self.store.push(RouterConfig.from_dict(config))
        self.configure()
        if self.after_push is not None:
            self.after_push(self.core)
        self.on_config()

    def configure(self) -> None:
        """What the router's app does on a push: the queue's bound, band bounds and service
        window follow the config (app.py: `queue.max_size`, `WaitQueue.configure`), and the
        quotas (`QuotaGate.configure`)."""
        cfg = self.core.cfg
        self.queue.max_size = cfg.queue.max_size
        self.queue.band_bound = cfg.flow_control.band_bound
        self.service.window_s = cfg.flow_control.service_window_s
        self.quotas.configure(cfg.quotas)
        # the dispatcher's `follow_config`: the split follows the weights, and revisions no
        # longer in the config become departed (the meter keeps the last few)
        self.split.configure(cfg.revisions)
        kept = {e.revision for e in cfg.endpoints} | set(
            cfg.revisions.weights if cfg.revisions else ())
        before = dict(self.meter.counts)
        self.meter.keep_only(kept)
        for rev in set(before) - set(self.meter.counts):  # the report still wants them
            self.forgotten[rev] = self.forgotten.get(rev, RevisionCounts()) + before[rev]

    def measured(self) -> dict[str, RevisionCounts]:
        """Every revision's counts over the whole run, those the router forgot included
        (the report's; the loop sees only `view()`'s, as a live router answers them)."""
        out = dict(self.forgotten)
        for rev, c in self.meter.counts.items():
            mine = c.copy()  # the plain counts, without the meter's sums
            out[rev] = out[rev] + mine if rev in out else mine
        return out

    def count(self, e: EndpointState, *, is_error: bool, ttft_s: float | None = None) -> None:
        """One upstream attempt on `e` ended (the forwarder's counting): its outcome, and
        the time to its first token when it streamed one."""
        counts = self.meter.of(e.revision)
        if counts is None:
            return
        counts.record(is_error=is_error)
        if ttft_s is not None:
            counts.observe_ttft(ttft_s)

    def observe_itl(self, revision: str, gap_s: float) -> None:
        """A gap between two streamed tokens of an endpoint of `revision`."""
        counts = self.meter.of(revision)
        if counts is not None:
            counts.observe_itl(gap_s)

    def flow(self, tenant: str, priority: int) -> Flow:
        """A request's standing (the dispatcher's `_flow`)."""
        fc: FlowControlConfig = self.core.cfg.flow_control
        self.labels.max_labels = fc.max_tenant_labels
        return request_flow(fc, tenant, priority, self.labels.label(tenant, fc))

    def engine_priority(self, e: EndpointState, seat: Seat | None) -> int:
        """The `priority` the engine behind `e` gets (the dispatcher's `with_priority`):
        the seat's standing, where the config forwards priorities to that engine."""
        fc = self.core.cfg.flow_control
        if seat is None or not fc.forward_priority or (
                e.engine == "vllm" and not fc.forward_priority_to_vllm):
            return 0
        return seat.standing

    async def view(self) -> RouterView | None:
        # the counters as GET /admin/config answers them, read back as the loop reads them
        revisions = {r: RevisionCounts.from_dict(c) for r, c in self.meter.to_dict().items()}
        return RouterView(self.version, {
            e.name: EndpointView(e.name, e.state_name(), e.num_in_flight, True)
            for e in self.store.endpoints()
        }, revisions=revisions)  # fmt: skip

    async def num_held(self) -> int:
        return len(self.held) if self.sees_held else 0

    async def perf_models(self) -> dict[str, RoleCoefficients]:
        """What this router's /metrics exports as perf-model gauges, handed over in
        process (the same `metrics.perf_models`)."""
        return perf_models(self.core)


class SimMetrics:
    def __init__(self, runtime: SimRuntime) -> None:
        self.runtime = runtime

    async def sample(self, replicas: Sequence[Replica], now: float) -> dict[str, Scrape]:
        return {r.name: Scrape(now, self.runtime.by_name[r.name].sample()) for r in replicas}


@dataclass(slots=True)
class SimStore:
    saved: Saved | None = None

    def load(self) -> Saved | None:
        return self.saved

    async def save(self, status: PoolStatus, loop: LoopState, view: dict[str, Any]) -> None:
        self.saved = Saved(status, loop)


@dataclass(slots=True)
class SimEvents:
    clock: SimClock
    events: list[tuple[float, Event]] = field(default_factory=list)

    def emit(self, event: Event) -> None:
        self.events.append((self.clock(), event))
