"""The virtual-time fleet: a trace in, per-request latencies and replica-seconds out.

What is real and what is simulated:
- real: each replica's `LLMEngine` (scheduler, paged KV cache, preemption), the router's
  policy code (`kvfleet_router.policies`, with its filters, scorers and saturation guard),
  the operator's `signals.aggregate`, `reconcile` (start/drain/stop plans and the router
  config it pushes) and the scaler under test;
- simulated: GPU time (the engine's cost-model profile, per step), process start-up
  (`startup_s` from provisioning to ready), the network (zero latency), and the router's
  hold queue (unbounded here; the real router answers 429 after its queue timeout).

Events run in time order: arrivals, replica steps (each replica on its own clock),
scrapes every `scrape_interval_s`, and a control-loop tick every
`autoscaling.intervalSeconds` that decides, reconciles and applies.
"""

from __future__ import annotations

import heapq
import random
from array import array
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kvfleet_engine.core.config import EngineConfig
from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.reconcile import Observed, ObservedReplica, initial_replicas, reconcile
from kvfleet_operator.signals import Scrape, ScrapeLog, aggregate
from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.endpoint import Signals as EndpointSignals
from kvfleet_router.policies import Policy, RouteContext, build_policy
from kvfleet_router.request_info import RequestInfo

from kvfleet_sim.replica import Finished, SimReplica
from kvfleet_sim.scalers import Scaler
from kvfleet_sim.trace import TraceRequest


class SimError(ValueError):
    """A pool or setting the simulator cannot run; one line for the CLI."""


@dataclass(slots=True)
class SimSettings:
    startup_s: float = 10.0  # provisioning -> ready (weights from a warm local cache)
    scrape_interval_s: float = 1.0
    seed: int = 0
    sees_router_queue: bool = True  # whether the scaler is told about router-held requests
    measure_from_s: float = 0.0  # warm-up before this: run, but not measured

    def __post_init__(self) -> None:
        if self.startup_s < 0 or self.scrape_interval_s <= 0:
            raise SimError("startup_s must be >= 0 and scrape_interval_s > 0")


@dataclass(slots=True)
class SimResult:
    finished: list[Finished]
    itl_gaps: array  # every inter-token gap, seconds
    timeline: list[tuple[float, int, int]]  # (t, provisioned, ready) per control tick
    lifetimes: list[tuple[float, float]]  # (provisioned, stopped) per replica
    end_s: float
    num_scale_events: int
    num_clipped: int  # prompts cut to fit max_model_len
    reasons: list[tuple[float, str]] = field(default_factory=list)  # when the count moved


def engine_config(pool: InferencePool) -> EngineConfig:
    e = pool.spec.engine
    if e.kind != "builtin" or e.runner != "simulated" or not e.profile:
        raise SimError("the simulator needs engine.kind: builtin, runner: simulated, a profile")
    if pool.spec.topology.is_disaggregated:
        raise SimError("the simulator runs unified pools only (prefill/decode is not modelled)")
    from kvfleet_engine.runners.cost_model import load_profile

    profile = load_profile(e.profile)
    return EngineConfig(
        num_blocks=e.num_blocks or profile.num_gpu_blocks,
        block_size=e.block_size,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_model_len=e.max_model_len or 8192,
        enable_prefix_caching=e.enable_prefix_caching,
    )


class FleetSim:
    ROLE = "unified"

    def __init__(self, pool: InferencePool, scaler: Scaler, settings: SimSettings) -> None:
        self.pool = pool
        self.spec = pool.spec
        self.scaler = scaler
        self.settings = settings
        self.config = engine_config(pool)
        self.profile = self.spec.engine.profile or ""
        self.replicas: dict[str, SimReplica] = {}
        self.endpoints: dict[str, EndpointState] = {}
        self.router_config: dict | None = None
        self.policy: Policy | None = None
        self.log = ScrapeLog()
        self.held: list[tuple[str, list[int], int, float]] = []
        self.heap: list[tuple[float, int, str, str]] = []
        self.order = 0
        self.next_id = 0
        # A fleet provisioned for the peak starts there; autoscaled ones start as the pool says.
        self.desired = getattr(scaler, "initial", None) or initial_replicas(self.spec)
        self.rng = random.Random(settings.seed)
        self.finished: list[Finished] = []
        self.itl_gaps = array("d")
        self.timeline: list[tuple[float, int, int]] = []
        self.reasons: list[tuple[float, str]] = []
        self.num_scale_events = 0
        self.lifetimes: list[tuple[float, float]] = []

    # --- events ---

    def push(self, t: float, kind: str, name: str = "") -> None:
        self.order += 1
        heapq.heappush(self.heap, (t, self.order, kind, name))

    def start_replica(self, t: float, ready_at: float) -> None:
        name = f"r{self.next_id}"
        self.next_id += 1
        self.replicas[name] = SimReplica(
            name, self.config, self.profile, t, ready_at, self.settings.measure_from_s
        )
        self.push(ready_at, "ready", name)

    def run(self, trace: list[TraceRequest]) -> SimResult:
        for _ in range(self.desired[self.ROLE]):
            self.start_replica(0.0, 0.0)  # the fleet is up before the trace starts
        self.push(0.0, "control")
        self.push(0.0, "scrape")
        interval = float(self.spec.autoscaling.interval_seconds)
        i, num_clipped, t = 0, 0, 0.0
        trace_end = trace[-1].t if trace else 0.0
        while self.heap or i < len(trace):
            if i < len(trace) and (not self.heap or trace[i].t <= self.heap[0][0]):
                req = trace[i]
                t = req.t
                prompt, clipped = self.prompt_tokens(i, req)
                num_clipped += clipped
                self.held.append((f"q{i}", prompt, req.num_output_tokens, t))
                self.dispatch(t)
                i += 1
                continue
            t, _, kind, name = heapq.heappop(self.heap)
            if kind == "step":
                self.step(t, name)
            elif kind == "ready":
                self.control(t, decide=False)
            elif kind == "scrape":
                self.scrape(t)
                if self.is_busy(i, len(trace), t, trace_end):
                    self.push(t + self.settings.scrape_interval_s, "scrape")
            elif kind == "control":
                self.control(t, decide=True)
                if self.is_busy(i, len(trace), t, trace_end):
                    self.push(t + interval, "control")
        for r in self.replicas.values():
            self.lifetimes.append((r.started_at, t))
            self.itl_gaps.extend(r.itl_gaps)
        return SimResult(self.finished, self.itl_gaps, self.timeline, self.lifetimes, t,
                         self.num_scale_events, num_clipped, self.reasons)  # fmt: skip

    def is_busy(self, i: int, n: int, t: float, trace_end: float) -> bool:
        has_work = any(r.num_in_flight for r in self.replicas.values()) or self.held
        return i < n or t <= trace_end or bool(has_work)

    def prompt_tokens(self, i: int, req: TraceRequest) -> tuple[list[int], int]:
        """Distinct tokens per request: the Azure trace has no prefix sharing to model."""
        n = req.num_prompt_tokens
        limit = self.config.max_model_len - req.num_output_tokens
        clipped = int(n > limit)
        n = max(1, min(n, limit))
        base = i * 7919
        return [(base + j) % 100_000 + 1 for j in range(n)], clipped

    # --- data plane ---

    def dispatch(self, t: float) -> None:
        if not self.held or self.policy is None:
            return
        eps = list(self.endpoints.values())
        still: list[tuple[str, list[int], int, float]] = []
        for rid, prompt, n_out, arrival in self.held:
            ctx = RouteContext(
                request=RequestInfo(model=self.spec.model.api_name, max_tokens=n_out),
                role=self.ROLE, num_prompt_tokens=len(prompt), now=t, rng=self.rng,
            )  # fmt: skip
            decision = self.policy.choose(eps, ctx)
            if decision.endpoint is None:
                still.append((rid, prompt, n_out, arrival))
                continue
            ep = decision.endpoint
            ep.num_in_flight += 1
            replica = self.replicas[ep.name]
            replica.add(rid, prompt, min(n_out, self.config.max_model_len - len(prompt)), arrival)
            if not replica.is_stepping:
                replica.is_stepping = True
                self.push(max(t, replica.clock.now_s), "step", ep.name)
        self.held = still

    def step(self, t: float, name: str) -> None:
        replica = self.replicas.get(name)
        if replica is None:
            return
        end, done = replica.step(t)
        for f in done:
            self.finished.append(f)
            if name in self.endpoints:
                self.endpoints[name].num_in_flight -= 1
        if replica.engine.has_unfinished_requests():
            self.push(end, "step", name)
        else:
            replica.is_stepping = False
        if done and self.held:
            self.dispatch(end)

    def scrape(self, t: float) -> None:
        for name, r in self.replicas.items():
            if t < r.ready_at:
                continue
            sample = r.sample()
            self.log.add(name, Scrape(t, sample))
            ep = self.endpoints.get(name)
            if ep is not None:
                ep.apply_scrape(EndpointSignals(
                    num_running=sample.num_running,
                    num_waiting=sample.num_waiting,
                    kv_usage=sample.kv_usage,
                    block_size=self.config.block_size,
                    scraped_at=t,
                ))
                ep.is_signals_fresh = True
        window = float(self.spec.autoscaling.window_seconds) + 2 * self.settings.scrape_interval_s
        self.log.prune(t, window)
        self.dispatch(t)

    # --- control plane ---

    def observed(self, t: float) -> Observed:
        out = []
        for name, r in self.replicas.items():
            if r.drain_started_at is not None:
                phase = "draining"
            else:
                phase = "ready" if t >= r.ready_at else "starting"
            out.append(ObservedReplica(
                name=name, role=self.ROLE, phase=phase, url=f"http://sim.{name}:8000",
                num_in_flight=r.num_in_flight, started_at=r.started_at,
                drain_started_at=r.drain_started_at,
            ))  # fmt: skip
        return Observed(out)

    def control(self, t: float, decide: bool) -> None:
        if decide:
            ready = {n: self.ROLE for n, r in self.replicas.items()
                     if t >= r.ready_at and r.drain_started_at is None}  # fmt: skip
            a = self.spec.autoscaling
            held = len(self.held) if self.settings.sees_router_queue else 0
            stale = 3 * self.settings.scrape_interval_s
            roles = [self.ROLE]
            stable = aggregate(self.log, ready, t, float(a.window_seconds), stale, held, roles)
            panic = aggregate(self.log, ready, t, float(a.panic.window_seconds), stale, held, roles)
            current = {self.ROLE: sum(r.drain_started_at is None for r in self.replicas.values())}
            desired, reason = self.scaler.decide(stable, panic, current, t)
            if desired != current:
                self.num_scale_events += 1
                self.reasons.append((t, reason))
            self.desired = desired
        wall = datetime.fromtimestamp(t, UTC)
        d = reconcile(self.pool, self.observed(t), self.desired, now=t, wall=wall,
                      previous_router_config=self.router_config)  # fmt: skip
        self.pool.status = d.status
        plan = d.roles[self.ROLE]
        for name in plan.to_undrain:
            self.replicas[name].drain_started_at = None
        for name in plan.to_drain:
            self.replicas[name].drain_started_at = t
        for _ in range(plan.num_to_start):
            self.start_replica(t, t + self.settings.startup_s)
        for name in plan.to_stop:
            self.stop(t, name)
        if plan.to_drain or plan.to_stop or plan.to_undrain:
            # Apply the drain marks before the router sees the new config.
            d = reconcile(self.pool, self.observed(t), self.desired, now=t, wall=wall,
                          previous_router_config=self.router_config)  # fmt: skip
        if d.is_router_config_changed:
            self.apply_router_config(d.router_config)
        provisioned = len(self.replicas)
        ready_count = sum(t >= r.ready_at and r.drain_started_at is None
                          for r in self.replicas.values())  # fmt: skip
        if decide:
            self.timeline.append((t, provisioned, ready_count))
        self.dispatch(t)

    def stop(self, t: float, name: str) -> None:
        r = self.replicas.pop(name)
        for f in r.abort_all(t):
            self.finished.append(f)
        self.lifetimes.append((r.started_at, t))
        self.itl_gaps.extend(r.itl_gaps)
        self.log.forget(name)

    def apply_router_config(self, data: dict) -> None:
        cfg = RouterConfig.from_dict(data)
        self.router_config = data
        if self.policy is None:
            self.policy = build_policy(cfg.policy.name, cfg)
        keep: dict[str, EndpointState] = {}
        for ep_cfg in cfg.endpoints:
            state = self.endpoints.get(ep_cfg.name)
            if state is None:
                state = EndpointState.from_config(ep_cfg, cfg.health)
                state.num_in_flight = self.replicas[ep_cfg.name].num_in_flight
            else:
                state.apply_config(ep_cfg)
            keep[ep_cfg.name] = state
        self.endpoints = keep
