"""The virtual-time fleet: a trace in, per-request latencies and replica-seconds out.

What is real and what is simulated:
- real: each replica's `LLMEngine` (scheduler, paged KV cache, preemption), the router's
  policy code (`kvfleet_router.policies`, with its filters, scorers and saturation guard),
  and the control loop itself: `ControlLoop.tick()` (signals, the scaler under test,
  reconcile, the router push, drains), the same code `kvfleet up` runs, over the
  virtual-time ports in `ports.py`;
- simulated: GPU time (the engine's cost-model profile, per step), process start-up
  (`startup_s` from provisioning to ready), the network (zero latency), and the router's
  hold queue (unbounded here; the real router answers 429 after its queue timeout).

Events run in time order: arrivals, replica steps (each replica on its own clock), the
router's scrapes of its endpoints every `scrape_interval_s`, control-loop ticks every
`tick_s` (the loop decides every `autoscaling.intervalSeconds`), and the end of a stopped
replica's grace period.
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass, field

from kvfleet_engine.core.config import EngineConfig
from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.api.status import DECISION_REASONS
from kvfleet_operator.loop.control_loop import ControlLoop, LoopTiming
from kvfleet_operator.loop.ports import Saved
from kvfleet_operator.loop.state import LoopState
from kvfleet_router.endpoint import Signals as EndpointSignals
from kvfleet_router.policies import RouteContext
from kvfleet_router.request_info import RequestInfo

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
from kvfleet_sim.replica import Finished
from kvfleet_sim.scalers import SimScaler
from kvfleet_sim.trace import TraceRequest


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

    def __post_init__(self) -> None:
        if self.startup_s < 0 or self.scrape_interval_s <= 0 or self.tick_s <= 0:
            raise SimError("startup_s must be >= 0, scrape_interval_s and tick_s > 0")


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
    def __init__(self, pool: InferencePool, scaler: SimScaler, settings: SimSettings) -> None:
        self.pool = pool
        self.spec = pool.spec
        self.settings = settings
        self.config = engine_config(pool)
        self.clock = SimClock()
        self.heap: list[tuple[float, int, str, str]] = []
        self.order = 0
        self.runtime = SimRuntime(self.config, self.spec.engine.profile or "", settings.startup_s,
                                  settings.measure_from_s, self.clock, self.push)  # fmt: skip
        self.router = SimRouter(settings.seed, settings.sees_router_queue)
        self.router.on_config = lambda: self.dispatch(self.clock.t)
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

    # --- events ---

    def push(self, t: float, kind: str, name: str = "") -> None:
        self.order += 1
        heapq.heappush(self.heap, (t, self.order, kind, name))

    def run(self, trace: list[TraceRequest]) -> SimResult:
        # The fleet is up before the trace starts: one tick starts it, one pushes its config.
        drive(self.loop.tick())
        drive(self.loop.tick())
        self.runtime.is_provisioned_before_start = False
        self.push(self.settings.tick_s, "tick")
        self.push(0.0, "scrape")
        i, num_clipped, t = 0, 0, 0.0
        trace_end = trace[-1].t if trace else 0.0
        while self.heap or i < len(trace):
            if i < len(trace) and (not self.heap or trace[i].t <= self.heap[0][0]):
                req = trace[i]
                t = self.clock.t = req.t
                prompt, clipped = self.prompt_tokens(i, req)
                num_clipped += clipped
                self.router.held.append(HeldRequest(f"q{i}", prompt, req.num_output_tokens, t))
                self.dispatch(t)
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
            elif kind == "kill":
                self.runtime.kill(name)
        return self.result(t, num_clipped)

    def result(self, end: float, num_clipped: int) -> SimResult:
        lifetimes = [(r.started_at, stopped) for r, stopped in self.runtime.retired]
        lifetimes += [(r.started_at, end) for r in self.runtime.by_name.values()]
        gaps = array("d")
        for r in [r for r, _ in self.runtime.retired] + list(self.runtime.by_name.values()):
            gaps.extend(r.itl_gaps)
        scale = [(t, e.message) for t, e in self.events.events if e.reason in DECISION_REASONS]
        return SimResult(self.finished + self.runtime.cut_off, gaps, self.timeline, lifetimes,
                         end, len(scale), num_clipped, scale)  # fmt: skip

    def is_busy(self, i: int, n: int, t: float, trace_end: float) -> bool:
        has_work = any(r.num_in_flight for r in self.runtime.by_name.values()) or self.router.held
        return i < n or t <= trace_end or bool(has_work)

    def prompt_tokens(self, i: int, req: TraceRequest) -> tuple[list[int], int]:
        """Distinct tokens per request: the Azure trace has no prefix sharing to model."""
        n = req.num_prompt_tokens
        limit = self.config.max_model_len - req.num_output_tokens
        clipped = int(n > limit)
        n = max(1, min(n, limit))
        base = i * 7919
        return [(base + j) % 100_000 + 1 for j in range(n)], clipped

    # --- control plane ---

    def tick(self, t: float) -> None:
        result = drive(self.loop.tick())
        if result.decision is not None:
            replicas = self.runtime.by_name.values()
            provisioned = sum(r.state != "stopping" for r in replicas)
            ready = sum(r.state == "ready" for r in replicas)
            self.timeline.append((t, provisioned, ready))
        self.dispatch(t)

    # --- data plane ---

    def dispatch(self, t: float) -> None:
        policy = self.router.policy
        if not self.router.held or policy is None:
            return
        eps = list(self.router.endpoints.values())
        still: list[HeldRequest] = []
        for held in self.router.held:
            ctx = RouteContext(
                request=RequestInfo(model=self.spec.model.api_name, max_tokens=held.num_output),
                role="unified", num_prompt_tokens=len(held.prompt), now=t, rng=self.router.rng,
            )  # fmt: skip
            decision = policy.choose(eps, ctx)
            if decision.endpoint is None:
                still.append(held)
                continue
            ep = decision.endpoint
            ep.num_in_flight += 1
            replica = self.runtime.by_name[ep.name]
            num_output = min(held.num_output, self.config.max_model_len - len(held.prompt))
            replica.add(held.request_id, held.prompt, num_output, held.arrival)
            if not replica.is_stepping:
                replica.is_stepping = True
                self.push(max(t, replica.clock.now_s), "step", ep.name)
        self.router.held = still

    def step(self, t: float, name: str) -> None:
        replica = self.runtime.by_name.get(name)
        if replica is None:
            return
        end, done = replica.step(t)
        endpoint = self.router.endpoints.get(name)
        for f in done:
            self.finished.append(f)
            if endpoint is not None:
                endpoint.num_in_flight -= 1
        if replica.engine.has_unfinished_requests():
            self.push(end, "step", name)
        else:
            replica.is_stepping = False
            if replica.state == "stopping":
                self.runtime.remove(name)  # drained: the process exits
        if done and self.router.held:
            self.dispatch(end)

    def scrape(self, t: float) -> None:
        """The router's own poll of its endpoints' /metrics (routing signals)."""
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
                scraped_at=t,
            ))  # fmt: skip
            ep.is_signals_fresh = True
        self.dispatch(t)
