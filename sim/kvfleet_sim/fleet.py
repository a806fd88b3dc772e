"""The virtual-time fleet: a trace in, per-request latencies and replica-seconds out.

What is real and what is simulated:
- real: each replica's `LLMEngine` (scheduler, paged KV cache, preemption, prefix cache and
  its KV events), the router's `RouterCore` (registry, approximate and precise prefix
  indexes, policies with their filters, scorers and saturation guard; every request goes
  through `route` and `start`, as the dispatcher does, and precise-mode endpoints get their
  engine's BlockStored/BlockRemoved events after each step, as `kv_events.py` feeds them),
  the router's own plan for each request (`kvfleet_router.pd_plan`, which its pd.py and
  dispatcher run too): for a prefill/decode pool decode first, the P/D decider, a prefill
  leg that holds its KV for the decode replica's preload; for a unified pool with
  `routing.kvSharing` the peer hint after the choice; and the control loop
  itself: `ControlLoop.tick()` (signals, the scaler under test, reconcile, the router
  push, drains), the same code `kvfleet up` runs, over the virtual-time ports in `ports.py`;
- simulated: GPU time (the engine's cost-model profile, per step), the P/D KV hand-off
  (`handoff.py`: bytes over a link plus a fixed latency), process start-up
  (`startup_s` from provisioning to ready), with `routing.kvSharing` the peer prefix
  fetch (`peer_fetch.py`: the router's own hint, the peer's real export and the
  target's real install, bytes over a link plus a fixed latency in between), the network
  (zero latency: KV events arrive at
  the end of the step that made them; `client_latency_s`, default 0, is the client's fixed
  cost per request, its hops through the router, added to the reported first-token and
  finish times).

Flow control is the router's own: each arrival is admitted as the dispatcher's `acquire`
admits it, through the same pure pieces (`kvfleet_router.flow`): its `Flow` (tenant, band,
weight) from the pushed `flow_control`; tried at once when nothing of its band or better is
queued (`FairQueue.would_lead`), else only on endpoints where it outranks seats; the
`FlowGate` gives the endpoints not saturated for it, the routing core picks among them, and
the gate seats it there (the engine gets the seat's standing as `priority`, so the real
scheduler orders and preempts by it, as a live kvfleet engine does). What cannot go now
waits in the bounded `FairQueue` (bands, weighted least attained service between tenants,
FCFS inside one); only its head is retried (on every request end, scrape, tick, config
push and expiry); one that waits past `queue.timeout_s` is refused (`saturated`, or `no-endpoint`
when none was ready), as is one that finds the queue full (`queue-full`). A refused request
counts as failed. A tenant is charged its prompt plus `max_tokens` at dispatch and refunded
the output it did not get when the request ends. A trace without tenants is one tenant in
one band: first come, first served, as before flow control. P/D pools admit the decode
leg this way (the prefill leg is routed after it, seatless, at priority 0, as pd.py does).

Events run in time order: arrivals, replica steps (each replica on its own clock), the
router's scrapes of its endpoints every `scrape_interval_s`, control-loop ticks every
`tick_s` (the loop decides every `autoscaling.intervalSeconds`), the end of a P/D KV
hand-off, a peer's answer to a prefix fetch and the fetch's end, the end of a stopped
replica's grace period, a queued request's TTL, and a rollout scenario's moment (`rollout.py`:
the pool's spec changes what its engines run, and the loop rolls it out by `spec.rollout`).
"""

from __future__ import annotations

import dataclasses
import heapq
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvfleet_engine.contract import KVEvent
from kvfleet_engine.contract.peer_prefix import parse_peer_prefix
from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.prefix_share import PrefixInstall
from kvfleet_engine.core.sequence import PrefixKV, PreloadedKV
from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.api.status import DECISION_REASONS
from kvfleet_operator.decide.rollout import revision_of
from kvfleet_operator.decide.router_config import is_router_kv_sharing
from kvfleet_operator.loop.control_loop import ControlLoop, LoopTiming
from kvfleet_operator.loop.ports import Saved
from kvfleet_operator.loop.state import LoopState
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.endpoint import Signals as EndpointSignals
from kvfleet_router.flow.fair_queue import QueueFull, Ticket
from kvfleet_router.flow.saturation import is_ready
from kvfleet_router.pd_plan import PDPlan, Planner, RoutePrefill, RunPrefill, Step, peer_hint
from kvfleet_router.perf_model import Mape
from kvfleet_router.policies.guard import imbalance_ratio
from kvfleet_router.proxy import Outcome
from kvfleet_router.quota_gate import charged_tokens
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import Routed

from kvfleet_sim.handoff import Handoff, HandoffError, kv_bytes_per_token
from kvfleet_sim.peer_fetch import PeerFetches, PeerStats
from kvfleet_sim.ports import (
    HeldRequest,
    SimClock,
    SimEvents,
    SimMetrics,
    SimRouter,
    SimRuntime,
    SimStore,
    drive,
)
from kvfleet_sim.replica import Finished, SimReplica
from kvfleet_sim.rollout import RolloutError, RolloutScenario, outcome, rollout_spec
from kvfleet_sim.scalers import SimScaler
from kvfleet_sim.trace import TraceRequest, prompt_tokens

REFUSED_BY = "router"  # Finished.replica of a request the router refused (flow control)


class SimError(ValueError):
    """A pool or setting the simulator cannot run; one line for the CLI."""


@dataclass(slots=True)
class SimSettings:
    startup_s: float = 10.0  # provisioning -> ready (weights from a warm local cache)
    scrape_interval_s: float = 1.0  # the router's own scrapes of its endpoints
    tick_s: float = 0.5  # the control loop's tick, as in `kvfleet up`
    seed: int = 0
    sees_router_queue: bool = True  # whether the scaler is told about router-held requests
    measure_from_s: float = 0.0  # warm-up before this: run, but not measured
    # The control loop runs at least until this, past the trace's last request: a measured
    # window that ends in idle time is paid for, and the scaler's scale-down in it seen.
    run_until_s: float = 0.0
    prefix_mode: str | None = None  # override every endpoint's prefix_mode (approx/precise)
    kv_bytes_per_s: float = 50e9  # P/D: the prefill -> decode link (400 Gb/s RDMA)
    kv_latency_s: float = 0.002  # P/D: fixed cost per hand-off
    # What a client sees on top of the engine: the request's way in (client -> router ->
    # engine) and the first byte's way out, added to each request's first-token and finish
    # times. Every arrival delayed by one constant leaves the queues as they were, so it
    # only shifts what is reported. bench/sim_fidelity.py measures it on a live fleet.
    client_latency_s: float = 0.0
    # routing.kvSharing: the link a peer prefix fetch crosses (peer_fetch.py); a 100 Gb/s
    # NIC by default, the engines' HTTP KV export rather than an RDMA engine
    peer_bytes_per_s: float = 12.5e9
    peer_latency_s: float = 0.002
    # Replicas of mixed speed: the cost profiles replicas take in turn, in creation order
    # (replica k runs replica_profiles[k mod len]); empty: every replica the pool's profile.
    replica_profiles: tuple[str, ...] = ()
    # The router's in-flight cap per endpoint; None: the operator's (twice the batch).
    endpoint_capacity: int | None = None
    # A rollout mid-replay (rollout.py): the spec changes at its time; None: no rollout.
    rollout: RolloutScenario | None = None

    def __post_init__(self) -> None:
        if self.startup_s < 0 or self.scrape_interval_s <= 0 or self.tick_s <= 0:
            raise SimError("startup_s must be >= 0, scrape_interval_s and tick_s > 0")
        if not self.client_latency_s >= 0:
            raise SimError("client_latency_s must be >= 0")
        if not (self.kv_bytes_per_s > 0 and self.kv_latency_s >= 0):
            raise SimError("kv_bytes_per_s must be > 0 and kv_latency_s >= 0")
        if not (self.peer_bytes_per_s > 0 and self.peer_latency_s >= 0):
            raise SimError("peer_bytes_per_s must be > 0 and peer_latency_s >= 0")
        if self.endpoint_capacity is not None and self.endpoint_capacity < 1:
            raise SimError(f"endpoint_capacity must be >= 1, got {self.endpoint_capacity}")
        if self.prefix_mode not in (None, "approximate", "precise"):
            raise SimError(f"prefix_mode must be approximate or precise, got {self.prefix_mode!r}")


@dataclass(slots=True)
class SimResult:
    finished: list[Finished]
    itl_gaps: array  # every inter-token gap, seconds
    timeline: list[tuple[float, int, int]]  # (t, provisioned, ready) per decision
    lifetimes: list[tuple[float, float]]  # (provisioned, stopped) per replica
    end_s: float
    num_scale_events: int
    num_clipped: int  # prompts cut to fit max_model_len
    reasons: list[tuple[float, str]] = field(default_factory=list)  # when the count moved
    imbalance: list[tuple[float, float]] = field(default_factory=list)  # (t, max-min / mean)
    prefix_tokens: tuple[int, int] = (0, 0)  # engines' (queried, hit) prompt tokens, measured
    router_hit_ratio: float = 0.0  # the router's own estimate (approximate index)
    lifetime_roles: list[str] = field(default_factory=list)  # the role of each lifetime
    role_timeline: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    num_prefill_legs: int = 0  # P/D: requests that took a separate prefill leg
    peer: PeerStats | None = None  # routing.kvSharing: hints and fetches, measured
    # the router's perf model, measured: ((sum |err|/actual, n) for TTFT, the same for TPOT)
    perf_error: tuple[tuple[float, int], tuple[float, int]] = ((0.0, 0), (0.0, 0))
    # flow control: request id -> its tenant, for requests not of the default tenant
    tenants: dict[str, str] = field(default_factory=dict)
    # requests the router refused (they are in `finished`, aborted), by reason
    refusals: dict[str, int] = field(default_factory=dict)
    rollout: dict[str, Any] | None = None  # the rollout scenario's outcome (rollout.outcome)


def engine_config(pool: InferencePool) -> EngineConfig:
    return engine_config_of(pool.spec)


def engine_config_of(spec: PoolSpec) -> EngineConfig:
    """The engine config a replica of `spec` runs (a rollout's new revision has its own)."""
    e = spec.engine
    if e.kind != "builtin" or e.runner != "simulated" or not e.profile:
        raise SimError("the simulator needs engine.kind: builtin, runner: simulated, a profile")
    from kvfleet_engine.runners.cost_model import load_profile

    try:
        profile = load_profile(e.profile)
    except (OSError, ValueError, KeyError) as exc:
        raise SimError(f"engine.profile {e.profile!r}: {exc}") from None
    if spec.topology.is_disaggregated or is_router_kv_sharing(spec):
        try:
            kv_bytes_per_token(profile)
        except HandoffError as exc:
            raise SimError(str(exc)) from None
    return EngineConfig(
        num_blocks=e.num_blocks or profile.num_gpu_blocks,
        block_size=e.block_size,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_model_len=e.max_model_len or 8192,
        enable_prefix_caching=e.enable_prefix_caching,
    )


class FleetSim:
    def __init__(self, pool: InferencePool, scaler: SimScaler, settings: SimSettings) -> None:
        self.pool = pool
        self.spec = pool.spec
        self.settings = settings
        self.config = engine_config(pool)
        self.clock = SimClock()
        self.heap: list[tuple[float, int, str, str]] = []
        self.order = 0
        self.runtime = SimRuntime(self.config, self.spec.engine.profile or "", settings.startup_s,
                                  settings.measure_from_s, self.clock, self.push,
                                  settings.replica_profiles)  # fmt: skip
        self.router = SimRouter(settings.seed, settings.sees_router_queue, settings.prefix_mode,
                                settings.endpoint_capacity)
        self.router.on_config = lambda: self.dispatch(self.clock.t)
        self.runtime.config_of = engine_config_of  # a rollout's revision may differ
        self.runtime.on_itl = self.router.observe_itl
        self.rollout_spec: PoolSpec | None = None
        self.rollout_started: tuple[float, str, str] | None = None  # (t, from rev, to rev)
        if settings.rollout is not None:
            try:  # refused now, not after half a replay
                self.rollout_spec = rollout_spec(pool.spec, settings.rollout)
            except RolloutError as exc:
                raise SimError(str(exc)) from None
            engine_config_of(self.rollout_spec)
            rules = self.rollout_spec.rollout
            if rules.strategy != "rolling" and rules.analysis.query is not None:
                # the loop asks Prometheus (`query_value`); unanswered, the check always fails
                raise SimError("spec.rollout.analysis.query: the simulator has no Prometheus "
                               "to ask; leave the query out of a simulated rollout")
        self.events = SimEvents(self.clock)
        # A fleet provisioned for the peak starts there; autoscaled ones start as the pool says.
        saved = Saved(pool.status, LoopState(desired=dict(scaler.initial))) \
            if scaler.initial else None  # fmt: skip
        self.loop = ControlLoop(
            pool, runtime=self.runtime, router=self.router, metrics=SimMetrics(self.runtime),
            store=SimStore(saved), events=self.events, clock=self.clock,
            timing=LoopTiming(tick_s=settings.tick_s), scaler=scaler.scaler,
        )  # fmt: skip
        self.finished: list[Finished] = []
        self.timeline: list[tuple[float, int, int]] = []
        self.role_timeline: list[tuple[float, dict[str, int]]] = []
        self.imbalance: list[tuple[float, float]] = []
        self.serving: dict[str, EndpointState] = {}  # request id -> the endpoint it holds
        self.seated: dict[str, HeldRequest] = {}  # request id -> a dispatched request
        self.tenants: dict[str, str] = {}  # request id -> tenant (default tenant omitted)
        self.refusals: dict[str, int] = {}
        self.routed: dict[str, Routed] = {}  # request id -> its routing decision (feedback)
        self.prefix_at_start: tuple[int, int] | None = None  # engines' counters at warm-up end
        self.perf_at_start: tuple[tuple[float, int], tuple[float, int]] | None = None
        # Every endpoint's error trackers ever seen, so that a replica scaled down keeps
        # its share of the error (summing the live ones only made the measured MAPE fall,
        # and go negative, with each scale-down). Keyed by tracker: one counted once.
        self.perf_trackers: dict[int, tuple[Mape, Mape]] = {}
        self.is_pd = self.spec.topology.is_disaggregated
        self.handoff: Handoff | None = None
        if self.is_pd:
            from kvfleet_engine.runners.cost_model import load_profile

            profile = load_profile(self.spec.engine.profile or "")
            self.handoff = Handoff(kv_bytes_per_token(profile), settings.kv_bytes_per_s,
                                   settings.kv_latency_s)  # fmt: skip
        self.planner = Planner(self.router.core)  # the router's own P/D plan (pd_plan.py)
        # request -> (held, prefill endpoint, plan, the leg's routing, when the leg was sent)
        self.prefilling: dict[str, tuple[HeldRequest, EndpointState, PDPlan[PreloadedKV],
                                         Routed, float]] = {}
        self.in_transfer: dict[str, tuple[HeldRequest, SimReplica, PreloadedKV]] = {}
        self.num_prefill_legs = 0
        # routing.kvSharing (unified pools; the dispatcher hints only unified requests)
        self.fetches: PeerFetches | None = None
        self.fetching: dict[str, HeldRequest] = {}  # id -> a request waiting for its fetch
        self.peer_at_start: PeerStats | None = None
        if is_router_kv_sharing(self.spec) and not self.is_pd:
            from kvfleet_engine.runners.cost_model import load_profile

            link = Handoff(kv_bytes_per_token(load_profile(self.spec.engine.profile or "")),
                           settings.peer_bytes_per_s, settings.peer_latency_s)
            self.fetches = PeerFetches(link, self.config.block_size)

    @staticmethod
    def check_pool(pool: InferencePool) -> None:
        """Raise SimError for a pool the simulator cannot model."""
        engine_config(pool)

    # --- events ---

    def push(self, t: float, kind: str, name: str = "") -> None:
        self.order += 1
        heapq.heappush(self.heap, (t, self.order, kind, name))

    def run(self, trace: list[TraceRequest],
            progress: Callable[[int], None] | None = None) -> SimResult:
        """Replay `trace`; `progress(n)` (if given) hears every 256th arrival's count."""
        # The fleet is up before the trace starts: one tick starts it, one pushes its config.
        drive(self.loop.tick())
        drive(self.loop.tick())
        self.runtime.is_provisioned_before_start = False
        self.push(self.settings.tick_s, "tick")
        self.push(0.0, "scrape")
        if self.settings.rollout is not None:
            self.push(self.settings.rollout.at_s, "rollout")
        i, num_clipped, t = 0, 0, 0.0
        trace_end = trace[-1].t if trace else 0.0
        while self.heap or i < len(trace):
            if i < len(trace) and (not self.heap or trace[i].t <= self.heap[0][0]):
                req = trace[i]
                t = self.clock.t = req.t
                limit = self.config.max_model_len - req.num_output_tokens
                num_clipped += req.num_prompt_tokens > limit
                prompt = prompt_tokens(req, i, limit)
                if progress is not None and not i & 255:
                    progress(i)
                h = HeldRequest(f"q{i}", prompt, req.num_output_tokens, t, req.tenant,
                                req.priority)
                if req.tenant != "default":
                    self.tenants[h.request_id] = req.tenant
                self.arrive(h, t)
                i += 1
                continue
            t, _, kind, name = heapq.heappop(self.heap)
            self.clock.t = t
            is_busy = self.is_busy(i, len(trace), t, trace_end)
            if kind == "step":
                self.step(t, name)
            elif kind == "tick":
                self.tick(t)
                if is_busy:
                    self.push(t + self.settings.tick_s, "tick")
            elif kind == "scrape":
                self.scrape(t)
                if is_busy:
                    self.push(t + self.settings.scrape_interval_s, "scrape")
            elif kind == "handoff":
                self.handoff_done(name, t)
            elif kind == "peer":
                self.peer_answers(name, t)
            elif kind == "fetched":
                self.fetch_done(name, t)
            elif kind == "expire":
                self.expire(name, t)
            elif kind == "rollout":
                self.roll_out(t)
            elif kind == "kill":
                for f in self.runtime.kill(name):
                    if f.request_id.startswith("p:"):
                        self.prefill_done(f, None, t)
                    else:
                        self.release(f.request_id)
        if progress is not None:
            progress(len(trace))
        return self.result(t, num_clipped)

    def result(self, end: float, num_clipped: int) -> SimResult:
        lifetimes = [(r.started_at, stopped) for r, stopped in self.runtime.retired]
        lifetimes += [(r.started_at, end) for r in self.runtime.by_name.values()]
        roles = [r.role for r, _ in self.runtime.retired]
        roles += [r.role for r in self.runtime.by_name.values()]
        gaps = array("d")
        for r in [r for r, _ in self.runtime.retired] + list(self.runtime.by_name.values()):
            gaps.extend(r.itl_gaps)
        scale = [(t, e.message) for t, e in self.events.events if e.reason in DECISION_REASONS]
        queried, hit = self.prefix_counters()
        q0, h0 = self.prefix_at_start or (0, 0)
        cut = [f for f in self.runtime.cut_off if not f.request_id.startswith("p:")]
        finished = self.finished + cut
        if hop := self.settings.client_latency_s:
            shift = dataclasses.replace
            finished = [shift(f, first_token=f.first_token + hop, finished=f.finished + hop)
                        for f in finished]  # fmt: skip
        (ta, tn), (pa, pn) = self.perf_error()
        (ta0, tn0), (pa0, pn0) = self.perf_at_start or ((0.0, 0), (0.0, 0))
        return SimResult(finished, gaps, self.timeline, lifetimes,
                         end, len(scale), num_clipped, scale, self.imbalance,
                         (queried - q0, hit - h0), self.router.core.prefix_hit_ratio, roles,
                         self.role_timeline, self.num_prefill_legs, self.peer_stats(),
                         ((ta - ta0, tn - tn0), (pa - pa0, pn - pn0)), dict(self.tenants),
                         dict(self.refusals), self.rollout_outcome(finished))

    def rollout_outcome(self, finished: list[Finished]) -> dict[str, Any] | None:
        scenario = self.settings.rollout
        if scenario is None:
            return None
        replicas = [r for r, _ in self.runtime.retired] + list(self.runtime.by_name.values())
        revision = {r.name: r.revision for r in replicas}
        served: dict[str, int] = {}
        for f in finished:
            if not f.is_aborted and f.replica in revision:
                served[revision[f.replica]] = served.get(revision[f.replica], 0) + 1
        at_end: dict[str, int] = {}
        for r in self.runtime.by_name.values():
            if r.state != "stopping":
                at_end[r.revision] = at_end.get(r.revision, 0) + 1
        return outcome(scenario, self.rollout_started, self.loop.pool.status,
                       self.events.events, self.router.measured(), at_end, served,
                       sum(f.is_aborted for f in finished))

    def roll_out(self, t: float) -> None:
        """The scenario's moment: the pool's spec changes what its engines run; the loop's
        next tick starts rolling it out (`ControlLoop.replace_spec`)."""
        scenario, new = self.settings.rollout, self.rollout_spec
        assert scenario is not None and new is not None
        old = revision_of(self.loop.pool.spec)
        target = revision_of(new)
        self.runtime.slowdowns[target] = scenario.slowdown
        self.rollout_started = (t, old, target)
        self.loop.replace_spec(new)
        self.spec = new

    def perf_error(self) -> tuple[tuple[float, int], tuple[float, int]]:
        """The router's perf-model error trackers summed over its endpoints so far."""
        self.note_perf_trackers()
        pairs = self.perf_trackers.values()
        return ((sum(t.sum_abs_pct for t, _ in pairs), sum(t.num_samples for t, _ in pairs)),
                (sum(p.sum_abs_pct for _, p in pairs), sum(p.num_samples for _, p in pairs)))

    def note_perf_trackers(self) -> None:
        for e in self.router.core.registry.all_endpoints():
            self.perf_trackers.setdefault(id(e.ttft_mape), (e.ttft_mape, e.tpot_mape))

    def prefix_counters(self) -> tuple[int, int]:
        """Prompt tokens looked up in, and found in, every engine's prefix cache so far."""
        replicas = [r for r, _ in self.runtime.retired] + list(self.runtime.by_name.values())
        kvs = [r.engine.kv_cache for r in replicas]
        return sum(kv.prefix_cache_queries for kv in kvs), sum(kv.prefix_cache_hits for kv in kvs)

    def peer_stats(self) -> PeerStats | None:
        if self.fetches is None:
            return None
        return self.fetches.stats.minus(self.peer_at_start or PeerStats())

    def is_busy(self, i: int, n: int, t: float, trace_end: float) -> bool:
        return (i < n or t <= trace_end or t < self.settings.run_until_s or bool(self.serving)
                or bool(self.router.held))

    # --- control plane ---

    def tick(self, t: float) -> None:
        result = drive(self.loop.tick())
        if result.decision is not None:
            replicas = self.runtime.by_name.values()
            provisioned = sum(r.state != "stopping" for r in replicas)
            ready = sum(r.state == "ready" for r in replicas)
            self.timeline.append((t, provisioned, ready))
            by_role = {role: 0 for role in self.spec.topology.roles()}
            for r in replicas:
                if r.state != "stopping":
                    by_role[r.role] = by_role.get(r.role, 0) + 1
            self.role_timeline.append((t, by_role))
        self.dispatch(t)

    # --- data plane ---

    def arrive(self, h: HeldRequest, t: float) -> None:
        """A request reaches the router: the dispatcher's `acquire` up to the queue. It is
        tried at once when it would lead the queue (nothing of its band or better waits),
        else only where it outranks seats; failing that it queues, with its TTL."""
        r = self.router
        over_quota = self.charge_quota(h, t)
        if over_quota is not None:
            self.refuse(h, over_quota, t)
            return
        h.flow = flow = r.flow(h.tenant, h.priority)
        # A rollout's split picks its revision once (the dispatcher's `acquire`); the trace
        # names no sessions, so every request takes the round-robin's next.
        h.revision = r.split.assign(None)
        leads = r.queue.would_lead(flow.band)
        got = self.place(h, t, outranking_only=not leads)
        if got is None:
            return
        timeout = r.core.cfg.queue.timeout_s
        ticket = Ticket(tenant=h.tenant, band=flow.band, weight=flow.weight,
                        priority=h.priority, deadline=t + timeout, seq=r.queue.next_seq(),
                        enqueued_at=t)
        try:
            r.queue.push(ticket, t)
        except QueueFull:
            self.refuse(h, "queue-full", t)
            return
        h.ticket = ticket
        r.held[h.request_id] = h
        r.by_ticket[ticket] = h
        self.push(t + timeout, "expire", h.request_id)
        self.dispatch(t)

    def dispatch(self, t: float) -> None:
        """Retry the queue's head (the one flow control serves next) until one cannot be
        placed (no endpoint, or all saturated for it): it stays at the head."""
        r = self.router
        while (ticket := r.queue.head(t)) is not None:
            h = r.by_ticket[ticket]
            got = self.place(h, t)
            if got is not None:
                return
            self.unqueue(h)

    def unqueue(self, h: HeldRequest) -> None:
        r = self.router
        assert h.ticket is not None
        r.queue.remove(h.ticket)
        del r.by_ticket[h.ticket], r.held[h.request_id]
        h.ticket = None

    def expire(self, rid: str, t: float) -> None:
        """A queued request's TTL passed: refused (429 saturated, or 503 no-endpoint); the
        new head tries at once (the dispatcher's `leave` wakes it)."""
        h = self.router.held.get(rid)
        if h is not None:
            self.unqueue(h)
            role = PDPlan(self.planner, RequestInfo(model=self.spec.model.api_name)).role
            is_any_ready = any(is_ready(e, role, t) for e in self.router.core.registry.endpoints)
            self.refuse(h, "saturated" if is_any_ready else "no-endpoint", t)  # as of now
            self.dispatch(t)

    def charge_quota(self, h: HeldRequest, t: float) -> str | None:
        """The HTTP front's quota gate before flow control (`QuotaGate.admit`, quota.py):
        the tenant's RPM and TPM buckets take one request and prompt + max_tokens, or the
        refusal's reason (`quota-requests`, `quota-tokens`)."""
        r = self.router
        if not r.quotas.is_limited(h.tenant):
            return None
        cfg = r.core.cfg
        info = RequestInfo(prompt_token_ids=h.prompt, max_tokens=h.num_output,
                           body={"max_tokens": h.num_output})
        tokens = charged_tokens(info, cfg.prefix.chars_per_token, cfg.quotas.default_max_tokens)
        verdict = r.quotas.admit(h.tenant, tokens, t)
        if not verdict.is_admitted:
            return f"quota-{verdict.limit_name}"
        h.quota_charged = tokens
        return None

    def settle_quota(self, h: HeldRequest, used: int, t: float) -> None:
        """The quota gate's settlement: what the answer used (an error answer nothing)."""
        if h.quota_charged:
            self.router.quotas.settle(h.tenant, h.quota_charged, used, t)
            h.quota_charged = 0

    def refuse(self, h: HeldRequest, reason: str, t: float) -> None:
        """The router answers 429/503 with `reason`: a failed request, never served."""
        self.settle_quota(h, 0, t)
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        self.finished.append(Finished(h.request_id, REFUSED_BY, h.arrival, t, t, 0, True,
                                      refusal=reason))

    def place(self, h: HeldRequest, t: float, outranking_only: bool = False) -> str | None:
        """Dispatch `h` now, or say why not (no-endpoint, saturated): the dispatcher's
        `_route_now` and `_dispatched` (FlowGate, then the routing core over the endpoints
        not saturated for it), then the router's own plan (`kvfleet_router.pd_plan`, as
        pd.py does): in a disaggregated pool decode first, then a prefill leg when the
        decider wants one and a prefill endpoint is free; in a unified one, the peer hint."""
        r, core = self.router, self.router.core
        flow = h.flow
        assert flow is not None
        info = RequestInfo(model=self.spec.model.api_name, prompt_token_ids=h.prompt,
                           max_tokens=h.num_output, tenant=h.tenant, priority=h.priority)
        plan: PDPlan[PreloadedKV] = PDPlan(self.planner, info)
        # With a rollout's split, the request's revision's endpoints first, then the others
        # (`RevisionSplit.pools`, as the dispatcher's `_route_now`); the reason is the most
        # hopeful one (saturated). Without a split: every endpoint, one pass.
        why, ep = "no-endpoint", None
        for endpoints in r.split.pools(core.registry.endpoints, h.revision):
            got = r.gate.candidates(flow, endpoints, plan.role, t, core.cfg.saturation,
                                    outranking_only=outranking_only)
            if isinstance(got, str):
                why = "saturated" if got == "saturated" else why
                continue
            free, outranked = got
            routed = core.route(info, plan.role, t, None, frozenset(), free, outranked)
            ep = core.start(routed)
            if ep is not None:
                break
            why = "saturated"
        if ep is None:
            return why
        h.sent_at = t
        r.feedback.attempt(ep, t)
        h.seat = r.gate.take(flow, ep, t)
        tokens = info.estimated_prompt_tokens(core.cfg.prefix.chars_per_token) + info.max_tokens
        h.num_charged_output = info.max_tokens
        r.gate.charge(h.tenant, tokens, t)
        self.serving[h.request_id] = ep
        self.routed[h.request_id] = routed
        self.seated[h.request_id] = h
        step: Step[PreloadedKV] = plan.chosen(routed)
        if isinstance(step, RoutePrefill):
            step = plan.prefill_routed(self.route_leg(info, "prefill", t,
                                                      self.same_revision(ep))[0])
        if isinstance(step, RunPrefill):
            self.num_prefill_legs += 1
            self.prefilling[h.request_id] = (h, step.endpoint, plan, step.routed, t)
            self.send(step.endpoint.name, "p:" + h.request_id, h, t, is_prefill=True)
            return None
        if self.start_fetch(routed, plan.role, ep, h, t):
            return None
        self.send(ep.name, h.request_id, h, t)
        return None

    def same_revision(self, decode: EndpointState) -> frozenset[str] | None:
        """The endpoints a prefill leg for `decode` may use (pd.py's `same_revision`): its
        revision's, as P/D never pairs revisions; None (any) when all run one revision."""
        endpoints = self.router.core.registry.endpoints
        if all(e.revision == decode.revision for e in endpoints):
            return None
        return frozenset(e.name for e in endpoints if e.revision == decode.revision)

    def route_leg(self, info: RequestInfo, role: str, t: float,
                  allowed: frozenset[str] | None = None,
                  ) -> tuple[Routed, EndpointState | None]:  # fmt: skip
        """One routing decision, counted in flight and as an attempt (the dispatcher's
        `try_route`); never waits. The P/D prefill leg's (seatless, as in pd.py), only
        among `allowed` when given."""
        routed = self.router.core.route(info, role, t, None, frozenset(), allowed)
        ep = self.router.core.start(routed)
        if ep is not None:
            self.router.feedback.attempt(ep, t)
        return routed, ep

    def start_fetch(self, routed: Routed, role: str, ep: EndpointState, h: HeldRequest,
                    t: float) -> bool:
        """The dispatcher's `with_peer_hint`: the plan's hint (`pd_plan.peer_hint`); with
        one, the request waits for its prefix (True) instead of entering the engine now."""
        fetches, core = self.fetches, self.router.core
        asked = peer_hint(core, routed, role) if fetches is not None else None
        if fetches is None or asked is None:
            return False
        decision, value = asked
        fetches.stats.hints[decision.reason] += 1
        fetches.stats.by_decision[f"{routed.decision.reason}/{decision.reason}"] += 1
        hint = parse_peer_prefix(value) if value is not None else None
        if hint is None:
            return False
        peer = next((e.name for e in core.registry.endpoints if e.url == hint.url), "")
        at = fetches.start(h.request_id, h.prompt, ep.name, peer, hint, t)
        if at is None:
            return False
        self.fetching[h.request_id] = h
        self.push(at, "peer", h.request_id)
        return True

    def is_fetching_for(self, name: str) -> bool:
        """A request on its way into this replica's engine (its server holds it while the
        prefix is fetched, so a drained replica does not exit under it)."""
        fetches = self.fetches
        return fetches is not None and any(f.target == name for f in fetches.in_flight.values())

    def peer_answers(self, rid: str, t: float) -> None:
        assert self.fetches is not None
        peer = self.runtime.by_name.get(self.fetches.in_flight[rid].peer)
        self.push(self.fetches.export(rid, peer.engine if peer else None, t), "fetched", rid)

    def fetch_done(self, rid: str, t: float) -> None:
        """The fetch is over: the request enters its engine with the blocks, if any."""
        assert self.fetches is not None
        f = self.fetches.landed(rid, t)
        h = self.fetching.pop(rid)
        if f.target not in self.runtime.by_name:  # the target replica is gone: lost
            self.fetches.record(f, None)
            self.finished.append(Finished(rid, f.target, h.arrival, t, t, 0, True))
            self.release(rid)
            return
        installed = self.send(f.target, rid, h, t, prefix_kv=f.prefix)
        self.fetches.record(f, installed if f.prefix is not None else None)

    def send(self, name: str, request_id: str, h: HeldRequest, t: float,
             is_prefill: bool = False, preloaded: PreloadedKV | None = None,
             prefix_kv: PrefixKV | None = None) -> PrefixInstall:  # fmt: skip
        replica = self.runtime.by_name[name]
        num_output = 1 if is_prefill else min(h.num_output,
                                              self.config.max_model_len - len(h.prompt))
        ep = self.serving.get(h.request_id)
        priority = 0 if is_prefill or ep is None else self.router.engine_priority(ep, h.seat)
        installed = replica.add(request_id, h.prompt, num_output, h.arrival,
                                hold_kv=is_prefill, preloaded_kv=preloaded,
                                prefix_kv=prefix_kv, priority=priority)  # fmt: skip
        if not replica.is_stepping:
            replica.is_stepping = True
            self.push(max(t, replica.clock.now_s), "step", name)
        return installed

    def prefill_done(self, f: Finished, replica: SimReplica | None, t: float) -> None:
        """The prefill leg answered: its endpoint is free; the plan's decode leg carries the
        KV (the hand-off is the decode replica's pull) or, after a failed leg (cut off),
        computes the prompt itself, as pd.py does."""
        rid = f.request_id[2:]
        h, prefill, plan, leg, sent_at = self.prefilling.pop(rid)
        self.router.core.end(leg)  # the leg's endpoint is `prefill` (pd_plan.RunPrefill)
        self.router.count(prefill, is_error=f.is_aborted)  # a side call: no TTFT
        if not f.is_aborted:  # the side call went well, and its latency is the prefill's
            self.router.feedback.prefill_leg_done(prefill, leg, t - sent_at, t)
        if rid not in self.serving:
            return
        kv = None if f.is_aborted or replica is None else replica.handoff(f.request_id)
        step = plan.prefill_done(kv)
        if step.kv is None:  # the decode endpoint computes the prompt itself
            if step.endpoint.name in self.runtime.by_name:
                h.sent_at = t
                self.send(step.endpoint.name, rid, h, t)
            return
        assert replica is not None and self.handoff is not None  # a P/D pool's leg answered
        self.in_transfer[rid] = (h, replica, step.kv)
        self.push(t + self.handoff.seconds(step.kv.num_tokens), "handoff", rid)

    def handoff_done(self, rid: str, t: float) -> None:
        h, prefill_replica, preload = self.in_transfer.pop(rid)
        prefill_replica.engine.release_held("p:" + rid)
        decode = self.serving.get(rid)
        if decode is None:
            return
        if decode.name not in self.runtime.by_name:  # the decode replica is gone: lost
            self.finished.append(Finished(rid, decode.name, h.arrival, t, t, 0, True))
            self.release(rid)
            return
        h.sent_at = t  # the decode leg goes now: its TTFT runs from here, as the router's
        self.send(decode.name, rid, h, t, preloaded=preload)

    def release(self, request_id: str, done: Finished | None = None) -> None:
        """The exchange ended: the endpoint's in-flight count drops, and a completed one
        feeds the router's health feedback (breaker, latency/UCB/SLO learners) as the
        dispatcher's `exchange_done` does; TTFT and total time count from the decision.
        Flow control gets the seat back and refunds the output not served (`_on_outcome`)."""
        ep = self.serving.pop(request_id, None)
        routed = self.routed.pop(request_id, None)
        h = self.seated.pop(request_id, None)
        if h is not None:
            r = self.router
            if h.seat is not None:
                r.gate.give_back(h.seat)
            served = min(done.num_output_tokens, h.num_charged_output) if done else 0
            if served < h.num_charged_output:
                r.gate.charge(h.tenant, served - h.num_charged_output, self.clock.t)
            if done is not None:  # an answer that never ended keeps its whole charge
                used = 0 if done.is_aborted else len(h.prompt) + done.num_output_tokens
                self.settle_quota(h, used, self.clock.t)
        if ep is not None:  # the forwarder's per-revision counting; an answer lost is an error
            sent = h.sent_at if h is not None else routed.ctx.now if routed is not None else 0.0
            ttft = None if done is None or done.is_aborted else done.first_token - sent
            self.router.count(ep, is_error=ttft is None, ttft_s=ttft)
        if ep is not None and routed is not None and done is not None and not done.is_aborted:
            now = routed.ctx.now
            outcome = Outcome(done.first_token - now, done.finished - now,
                              done.num_output_tokens, is_stream=True)  # fmt: skip
            self.router.feedback.exchange_done(ep, routed, outcome, done.finished)
        if routed is not None:
            self.router.core.first_byte(routed)
        if ep is not None:
            self.router.core.finish(ep)
            self.router.core.registry.prune_retired()

    def first_byte(self, request_id: str) -> None:
        """A request's first token, or a prefill leg's answer, as the router sees its first
        byte: no longer pending where it was sent (`RouterCore.first_byte`)."""
        if request_id.startswith("p:"):
            if (prefilling := self.prefilling.get(request_id[2:])) is not None:
                _, _, _, leg, _ = prefilling
                self.router.core.first_byte(leg)
        elif (routed := self.routed.get(request_id)) is not None:
            self.router.core.first_byte(routed)

    def step(self, t: float, name: str) -> None:
        replica = self.runtime.by_name.get(name)
        if replica is None:
            return
        end, done = replica.step(t)
        for rid in replica.first_tokens:
            self.first_byte(rid)
        self.feed_kv_events(name, replica.engine.drain_kv_events())
        for f in done:
            if f.request_id.startswith("p:"):
                self.prefill_done(f, replica, end)
                continue
            self.finished.append(f)
            self.release(f.request_id, f)
        if replica.engine.has_unfinished_requests():
            self.push(end, "step", name)
        else:
            replica.is_stepping = False
            if replica.state == "stopping" and not self.is_fetching_for(name):
                self.runtime.remove(name)  # drained: the process exits
        if done and self.router.held:
            self.dispatch(end)

    def feed_kv_events(self, name: str, events: list[KVEvent]) -> None:
        """What the router's KV-event follower does with each line, for endpoints in
        precise mode (it follows only those, and only while they are in the config)."""
        ep = self.router.endpoints.get(name)
        if events and ep is not None and ep.prefix_mode == "precise":
            apply = self.router.core.precise.apply
            for event in events:
                apply(name, event)

    def scrape(self, t: float) -> None:
        """The router's own poll of its endpoints' /metrics (routing signals), and one
        load-imbalance sample over the endpoints taking requests."""
        self.note_perf_trackers()
        if self.prefix_at_start is None and t >= self.settings.measure_from_s:
            self.prefix_at_start = self.prefix_counters()
            self.perf_at_start = self.perf_error()
            if self.fetches is not None:
                self.peer_at_start = self.fetches.stats.copy()
        loads: dict[str, list[float]] = {}
        fetches = self.fetches
        for name, ep in self.router.endpoints.items():
            replica = self.runtime.by_name.get(name)
            if replica is None:
                continue
            sample = replica.sample()
            ep.apply_scrape(EndpointSignals(
                num_running=sample.num_running,
                num_waiting=sample.num_waiting,
                kv_usage=sample.kv_usage,
                block_size=self.config.block_size,
                num_gpu_blocks=self.config.num_blocks,
                scraped_at=t,
                peer=fetches.replica_totals(name).scrape() if fetches is not None else None,
            ))  # fmt: skip
            ep.is_signals_fresh = True
            if ep.is_accepting() and replica.state == "ready":
                loads.setdefault(ep.role, []).append(ep.queue_depth() / ep.capacity)
        if t >= self.settings.measure_from_s and loads:
            self.imbalance.append((t, max(imbalance_ratio(v) for v in loads.values())))
        self.dispatch(t)
