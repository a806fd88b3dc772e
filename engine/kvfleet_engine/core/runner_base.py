"""The contract between the scheduler side (no torch) and a runner (torch or simulated).

The engine builds one `StepBatch` per step from the scheduler's decisions; a runner
computes (or pretends to compute) it and returns the sampled token for every sequence
whose chunk reached the end of its known tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from kvfleet_engine.core.sampling_params import SamplingParams


@dataclass(slots=True)
class ScheduledSeq:
    """One request's share of a step: a chunk of prompt, or one decode token."""

    request_id: str
    token_ids: list[int]  # the tokens to compute this step, positions start_pos..
    start_pos: int  # num_computed_tokens before this step
    block_table: list[int]  # physical block ids covering positions 0..start_pos+len-1
    do_sample: bool  # True when the chunk ends at the last known token
    params: SamplingParams
    num_output_tokens: int = 0  # generated so far (seeded samplers use it as an offset)
    num_cached_tokens: int = 0  # prefix-cache hit length, for cost models


@dataclass(slots=True)
class StepBatch:
    seqs: list[ScheduledSeq] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)


class Runner(Protocol):
    """What the engine needs from a runner."""

    block_size: int
    num_blocks: int

    def execute(self, batch: StepBatch) -> dict[str, int]:
        """Run one step; return request_id -> sampled token for seqs with do_sample."""
        ...

    def release(self, request_id: str) -> None:
        """Forget per-request state (sampler generators) once a request ends."""
        ...

    def read_blocks(self, block_ids: list[int]) -> bytes:
        """Raw KV bytes of these blocks (all layers, K and V), for P/D transfer."""
        ...

    def write_blocks(self, block_ids: list[int], data: bytes) -> None:
        """Install KV bytes produced by `read_blocks` on another replica."""
        ...

    def kv_block_shape(self) -> tuple[str, list[int]]:
        """(dtype name, shape) of what read_blocks returns for one block."""
        ...
