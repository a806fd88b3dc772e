"""One simulated replica: the real `LLMEngine` over a `SimulatedRunner` on its own virtual
clock, plus the TTFT/ITL histograms a real server would export at /metrics.

The fleet loop calls `add(...)` when the router sends a request, `step(now)` when the
replica is free, and `sample()` when it scrapes. Each replica keeps its own clock: a step
that starts at `now` ends at `now + step_time` (the cost model's), and every token of
that step is stamped with the end time, as a GPU would deliver it.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.prefix_share import PrefixInstall
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.core.sequence import PrefixKV, PreloadedKV
from kvfleet_engine.runners.cost_model import CostProfile
from kvfleet_engine.runners.sim_runner import SimulatedRunner, VirtualClock
from kvfleet_engine.server.metrics import (
    ITL_BUCKETS,
    QUEUE_BUCKETS,
    TTFT_BUCKETS,
    mean_time_per_output_token,
    queue_time_s,
)
from kvfleet_operator.decide.role_signals import ReplicaSample

from kvfleet_sim.fake_backend import FakeBackendEngine, FakeBackendModel

MIN_STEP_S = 1e-4  # a step that schedules nothing still moves time, so the loop advances


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1

    def cumulative(self) -> tuple[tuple[float, float], ...]:
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, float(total)))
        return tuple(out)


@dataclass(slots=True)
class Finished:
    request_id: str
    replica: str
    arrival: float
    first_token: float
    finished: float
    num_output_tokens: int
    is_aborted: bool = False
    num_prompt_tokens: int = 0  # the prompt it was sent with (0: never reached an engine)
    refusal: str = ""  # why the router refused it (flow control's drop reason), if it did


class SimReplica:
    def __init__(self, name: str, config: EngineConfig, profile: str | CostProfile,
                 started_at: float,
                 ready_at: float, measure_from: float = 0.0, role: str = "unified",
                 fake: FakeBackendModel | None = None,
                 now: Callable[[], float] | None = None) -> None:  # fmt: skip
        """`fake` (with the fleet's clock `now`): the replica is the router benchmark's fake
        backend (`fake_backend.py`) instead of kvfleet's engine on `profile`."""
        self.name = name
        self.role = role
        self.state = "starting"  # a reconcile phase, set by the simulated runtime
        self.num_restarts = 0
        self.last_error = ""
        self.revision = ""  # the engine template it runs (set by the simulated runtime)
        self.clock = VirtualClock(started_at)
        self.engine: LLMEngine
        if fake is not None:
            # It has the part of LLMEngine's interface a unified pool's replica uses (no P/D
            # hand-off, no peer fetch: `run.build_sim` refuses those pools with it).
            self.engine = cast(LLMEngine, FakeBackendEngine(
                fake, self.clock, now or (lambda: self.clock.now_s)))
        else:
            runner = SimulatedRunner(
                profile, num_blocks=config.num_blocks, block_size=config.block_size,
                time_mode="virtual", clock=self.clock, check_kv=False,
            )  # fmt: skip
            self.engine = LLMEngine(config, runner, tokenizer=None, eos_token_ids=(),
                                    clock=self.clock)  # fmt: skip
        self.started_at = started_at
        self.ready_at = ready_at
        self.is_stepping = False
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.tpot = Histogram(ITL_BUCKETS)  # per request, at its finish (as vLLM's)
        self.queue_time = Histogram(QUEUE_BUCKETS)  # as the server observes it, at the finish
        self.itl_gaps = array("d")  # inter-token gaps of measured requests, exact
        self.measure_from = measure_from  # requests arriving earlier are warm-up
        # every inter-token gap, told as it happens (the router's per-revision ITL)
        self.on_itl: Callable[[float], None] | None = None
        # the requests whose first token the last step produced (the router's first byte)
        self.first_tokens: list[str] = []
        self._arrival: dict[str, float] = {}
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._prompt_len: dict[str, int] = {}

    @property
    def address(self) -> str:
        return f"http://sim.{self.name}:8000"

    @property
    def num_in_flight(self) -> int:
        return len(self._arrival)

    def add(self, request_id: str, prompt: list[int], num_output: int, arrival: float,
            hold_kv: bool = False, preloaded_kv: PreloadedKV | None = None,
            prefix_kv: PrefixKV | None = None, priority: int = 0) -> PrefixInstall:  # fmt: skip
        """A request as the server would get it; `hold_kv` for a P/D prefill leg (the
        blocks stay until `release_held`), `preloaded_kv` for a decode leg, `prefix_kv`
        for blocks fetched from a peer (what the engine installed comes back); `priority`
        the body's (lower first: the scheduler orders and preempts by it)."""
        params = SamplingParams(max_tokens=num_output, temperature=0.0, ignore_eos=True)
        installed = self.engine.add_request(request_id, prompt, params, priority=priority,
                                            arrival_time=arrival, hold_kv=hold_kv,
                                            preloaded_kv=preloaded_kv,
                                            prefix_kv=prefix_kv)  # fmt: skip
        self._arrival[request_id] = arrival
        self._prompt_len[request_id] = len(prompt)
        return installed

    def handoff(self, request_id: str) -> PreloadedKV:
        """A finished prefill leg's KV, as the decode replica's pull would read it."""
        engine = self.engine
        n = engine.get_held_num_tokens(request_id)
        blocks = engine.get_held_blocks(request_id)[: -(-n // engine.config.block_size)]
        return PreloadedKV(n, engine.runner.read_blocks(blocks))

    def step(self, now: float) -> tuple[float, list[Finished]]:
        """Run one engine step starting at `now`; returns (end time, finished requests)."""
        self.clock.now_s = max(self.clock.now_s, now)
        self.first_tokens = []
        outputs = self.engine.step()
        if self.clock.now_s <= now:
            self.clock.advance(MIN_STEP_S)
        end = self.clock.now_s
        done: list[Finished] = []
        for out in outputs:
            rid = out.request_id
            if rid not in self._arrival:
                continue
            if out.new_token_ids:
                if rid not in self._first:
                    self._first[rid] = end
                    self.first_tokens.append(rid)
                    self.ttft.observe(end - self._arrival[rid])
                else:
                    gap = end - self._last[rid]
                    self.itl.observe(gap)
                    if self.on_itl is not None:
                        self.on_itl(gap)
                    if self._arrival[rid] >= self.measure_from:
                        self.itl_gaps.append(gap)
                self._last[rid] = end
            if out.is_finished:
                queued = queue_time_s(out)
                if queued is not None:
                    self.queue_time.observe(queued)
                done.append(self._finish(rid, end, len(out.token_ids), out.finish_reason))
        return end, done

    def _finish(self, rid: str, end: float, num_tokens: int, reason: str | None) -> Finished:
        arrival = self._arrival.pop(rid)
        first = self._first.pop(rid, end)
        self._last.pop(rid, None)
        if reason != "abort" and num_tokens > 0:
            self.tpot.observe(mean_time_per_output_token(first, end, num_tokens))
        return Finished(rid, self.name, arrival, first, end, num_tokens, reason == "abort",
                        self._prompt_len.pop(rid, 0))

    def abort_all(self, now: float) -> list[Finished]:
        """Drain timeout: what is still in flight is cut off (counted as failed)."""
        out = []
        for rid in list(self._arrival):
            self.engine.abort_request(rid)
            out.append(self._finish(rid, now, 0, "abort"))
        return out

    def sample(self) -> ReplicaSample:
        s = self.engine.stats()
        return ReplicaSample(
            num_running=float(s.num_running),
            num_waiting=float(s.num_waiting),
            kv_usage=s.kv_usage,
            num_waiting_prompt_tokens=float(s.num_waiting_prompt_tokens),
            num_preemptions=float(s.num_preemptions),
            num_prompt_tokens=float(s.num_prompt_tokens),
            num_generation_tokens=float(s.num_generation_tokens),
            num_prefix_queries=float(s.prefix_cache_queries),
            num_prefix_hits=float(s.prefix_cache_hits),
            ttft=self.ttft.cumulative(),
            itl=self.itl.cumulative(),
            tpot=self.tpot.cumulative(),
            queue_time=self.queue_time.cumulative(),
            role=self.role,
            is_draining=self.state == "draining",
        )
