"""A replica that behaves like the router benchmark's fake backend, in virtual time.

`bench/kvfleet_bench/fake_backend.py` is what `bench/router_cache_hits.py` measures routers
against: an OpenAI server with an LRU-bounded prefix cache in blocks and no batching.
Each request, the moment it arrives,
1. looks its prompt up in the cache: it hits the longest run of leading blocks held, then
   every block of the prompt is stored (or refreshed) head first, and the least recently
   used blocks beyond the bound are dropped (`kvfleet_bench/prefix_cache.py`);
2. waits `prefill_s_per_block` per block it missed, then `s_per_output_token` per output
   token, independently of every other request (no queue, no batch), and is answered
   whole (not streamed).
Its /metrics report the requests in flight as running, none waiting, and the blocks the
in-flight prompts hold over the cache's size as KV usage.

`FakeBackendEngine` is that, behind the part of `LLMEngine`'s interface the simulator's
replica and fleet use (`add_request`, `step`, `stats`, ...), on the replica's virtual
clock. Arrivals are stamped with the fleet's clock (`now`), since a replica's own clock
runs ahead to the end of its current step. A step ends at the earliest completion or
after `step_s`, whichever is first, so a request that arrives during a step is answered
at most `step_s` after its time. Blocks are `block_tokens` tokens; the simulator's trace
expands each Mooncake hash id into one block (`TraceRequest.block_tokens`).

    FakeBackendModel(cache_blocks=3000, block_tokens=64, prefill_s_per_block=0.04 / 11,
                     s_per_output_token=0.02 / 11)
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvfleet_engine.contract import KVEvent
from kvfleet_engine.core.outputs import EngineStats
from kvfleet_engine.core.prefix_share import PrefixInstall
from kvfleet_engine.runners.sim_runner import VirtualClock


@dataclass(slots=True, frozen=True)
class FakeBackendModel:
    cache_blocks: int  # the LRU bound per backend, in blocks
    block_tokens: int  # tokens per block
    prefill_s_per_block: float  # per block the cache missed
    s_per_output_token: float
    step_s: float = 0.001  # the longest step: how late a mid-step arrival may be answered

    def __post_init__(self) -> None:
        if self.cache_blocks < 1 or self.block_tokens < 1:
            raise ValueError("cache_blocks and block_tokens must be >= 1")
        if min(self.prefill_s_per_block, self.s_per_output_token) < 0 or self.step_s <= 0:
            raise ValueError("times must be >= 0 and step_s > 0")


class LRUBlocks:
    """The fake backend's prefix cache: chained block hashes, LRU-bounded in blocks."""

    __slots__ = ("num_blocks", "_blocks")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup_and_store(self, hashes: list[int]) -> int:
        """Leading blocks held; then the prompt's blocks are stored head first and the
        least recently used beyond the bound dropped (so a chain's head goes first)."""
        blocks = self._blocks
        num_hit = 0
        for h in hashes:
            if h not in blocks:
                break
            num_hit += 1
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        for _ in range(len(blocks) - self.num_blocks):
            blocks.popitem(last=False)
        return num_hit


def chain_hashes(tokens: list[int], block_tokens: int) -> list[int]:
    """Hash of each full block together with its parent (equal hashes, equal prefixes)."""
    out: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        parent = hash((parent, tuple(tokens[start:start + block_tokens])))
        out.append(parent)
    return out


@dataclass(slots=True)
class FakeOutput:
    """What `SimReplica.step` reads of an engine's RequestOutput."""

    request_id: str
    token_ids: list[int]
    is_finished: bool = True
    finish_reason: str | None = "length"

    @property
    def new_token_ids(self) -> list[int]:
        return self.token_ids


@dataclass(slots=True)
class FakeCounters:
    """The engine's `kv_cache` counters the fleet reads (prompt tokens looked up, hit)."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


@dataclass(slots=True)
class _InFlight:
    done_at: float
    num_output: int
    num_blocks: int


@dataclass(slots=True)
class FakeBackendEngine:
    model: FakeBackendModel
    clock: VirtualClock  # the replica's
    now: Callable[[], float]  # the fleet's: when a request arrives
    cache: LRUBlocks = field(init=False)
    kv_cache: FakeCounters = field(default_factory=FakeCounters)
    in_flight: dict[str, _InFlight] = field(default_factory=dict)
    _done: list[tuple[float, str]] = field(default_factory=list)  # heap of (done_at, id)
    num_blocks_in_use: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0

    def __post_init__(self) -> None:
        self.cache = LRUBlocks(self.model.cache_blocks)

    def add_request(self, request_id: str, prompt: list[int], params: Any,
                    arrival_time: float | None = None, hold_kv: bool = False,
                    preloaded_kv: Any = None, prefix_kv: Any = None,
                    priority: int = 0) -> PrefixInstall:  # a fake backend ignores priority
        if hold_kv or preloaded_kv is not None or prefix_kv is not None:
            raise ValueError("the fake backend serves unified requests only (no P/D, no "
                             "peer prefix fetch)")
        m = self.model
        hashes = chain_hashes(prompt, m.block_tokens)
        num_hit = self.cache.lookup_and_store(hashes)
        self.kv_cache.prefix_cache_queries += len(hashes) * m.block_tokens
        self.kv_cache.prefix_cache_hits += num_hit * m.block_tokens
        self.num_prompt_tokens += len(prompt)
        num_output = int(params.max_tokens)
        done_at = (self.now() + m.prefill_s_per_block * (len(hashes) - num_hit)
                   + m.s_per_output_token * num_output)
        self.in_flight[request_id] = _InFlight(done_at, num_output, len(hashes))
        self.num_blocks_in_use += len(hashes)
        heapq.heappush(self._done, (done_at, request_id))
        return PrefixInstall()

    def step(self) -> list[FakeOutput]:
        """Answers what is done by the step's start (the fleet releases them then, at
        their own time), then runs to the next completion or `step_s`, whichever is first."""
        heap = self._done
        start = self.clock.now_s
        out: list[FakeOutput] = []
        while heap and heap[0][0] <= start:
            _, rid = heapq.heappop(heap)
            req = self.in_flight.pop(rid, None)
            if req is None:  # aborted
                continue
            self.num_blocks_in_use -= req.num_blocks
            self.num_generation_tokens += req.num_output
            out.append(FakeOutput(rid, [0] * req.num_output))
        end = start + self.model.step_s
        if heap and heap[0][0] < end:
            end = heap[0][0]
        self.clock.now_s = end
        return out

    def abort_request(self, request_id: str) -> bool:
        req = self.in_flight.pop(request_id, None)
        if req is not None:
            self.num_blocks_in_use -= req.num_blocks
        return req is not None

    def has_unfinished_requests(self) -> bool:
        return bool(self.in_flight)

    def drain_kv_events(self) -> list[KVEvent]:
        return []  # the fake backend publishes none

    def stats(self) -> EngineStats:
        m = self.model
        return EngineStats(
            num_running=len(self.in_flight), num_waiting=0,
            kv_usage=min(1.0, self.num_blocks_in_use / m.cache_blocks),
            prefix_cache_queries=self.kv_cache.prefix_cache_queries,
            prefix_cache_hits=self.kv_cache.prefix_cache_hits, num_preemptions=0,
            num_waiting_prompt_tokens=0, num_gpu_blocks=m.cache_blocks,
            block_size=m.block_tokens, num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=self.num_generation_tokens,
        )  # fmt: skip
