"""Request state: tokens, progress, blocks, priority and timing of one request.

Plain object with __slots__: the engine touches these fields every step, for every
running request, so attribute access must stay cheap.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from kvfleet_engine.core.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # not admitted yet, or preempted (to be recomputed)
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class PreloadedKV:
    """KV of the first `num_tokens` prompt tokens, computed elsewhere (P/D transfer).

    `data` is what another replica's `runner.read_blocks` returned for the
    ceil(num_tokens / block_size) blocks that hold those tokens.
    """

    num_tokens: int
    data: bytes


@dataclass(slots=True)
class PrefixKV:
    """KV of the prompt's first len(block_hashes) full blocks, fetched from a peer's prefix
    cache (`block_hashes` are what the peer said they are; the engine checks them against
    the prompt). `data` is the peer's `runner.read_blocks` of those blocks, in order.
    Installed as prefix-cache entries when the request is added."""

    block_hashes: list[int]
    data: bytes


@dataclass(slots=True)
class RequestTiming:
    """Times from the engine's clock, so the server can derive queue time, TTFT and ITL."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


class Request:
    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "output_token_ids",
        "all_token_ids",
        "params",
        "priority",
        "arrival_time",
        "status",
        "num_computed_tokens",
        "block_ids",
        "block_hashes",
        "num_hashed_blocks",
        "num_cached_tokens",
        "num_preemptions",
        "hold_kv",
        "preloaded_kv",
        "timing",
        "finish_reason",
        "detokenizer",
        "sort_key",
        "num_uncached_estimate",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        arrival_time: float = 0.0,
        hold_kv: bool = False,
        preloaded_kv: PreloadedKV | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids = list(prompt_token_ids)  # prompt + output, what the KV covers
        self.params = params
        self.priority = priority
        self.arrival_time = arrival_time
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []  # block table: block i holds positions i*bs..
        self.block_hashes: list[int] = []  # chained hashes of full blocks of all_token_ids
        self.num_hashed_blocks = 0  # leading blocks already registered in the prefix cache
        self.num_cached_tokens = 0  # prefix-cache hit length at (first) admission
        self.num_preemptions = 0
        self.hold_kv = hold_kv
        self.preloaded_kv = preloaded_kv
        self.timing = RequestTiming(arrival_time)
        self.finish_reason: str | None = None
        self.detokenizer: Any = None  # output_processor.IncrementalDetokenizer when texts are made
        self.sort_key: tuple[float, float, int] = (0.0, 0.0, 0)  # set by the scheduler
        self.num_uncached_estimate = 0  # uncached prompt tokens, counted while waiting

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.value}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"blocks={self.block_ids})"
        )
