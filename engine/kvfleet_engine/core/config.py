"""Engine configuration: cache geometry, batching limits and scheduling policy."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class EngineConfig:
    """Limits the scheduler works within. Checked once, here.

    Priorities follow vLLM: a LOWER value is served first. With `aging_seconds` set, a
    request waiting that long gains one priority class, so none starves; None disables
    aging (strict classes, then age).
    """

    num_blocks: int = 1024  # KV blocks in the runner, including the reserved null block 0
    block_size: int = 16  # tokens per block
    max_num_seqs: int = 64  # running requests at most
    max_num_batched_tokens: int = 512  # tokens computed per step, over all requests
    max_model_len: int = 2048  # prompt + output tokens of one request
    kv_safety_margin: float = 0.05  # fraction of blocks kept free when admitting new requests
    enable_prefix_caching: bool = True
    aging_seconds: float | None = 10.0  # waiting time worth one priority class
    # a waiting request that outranks the least important running one takes its seat when
    # all max_num_seqs are taken (that one is preempted by recompute)
    preempt_for_priority: bool = True
    long_prefill_token_threshold: int = 0  # cap on one request's chunk per step; 0 = no cap
    max_pending_kv_events: int = 100_000  # undrained KV events kept; older ones are dropped

    def __post_init__(self) -> None:
        _require(self.block_size >= 1, "block_size must be at least 1")
        _require(self.num_blocks >= 2, "num_blocks must be at least 2 (block 0 is reserved)")
        _require(self.max_num_seqs >= 1, "max_num_seqs must be at least 1")
        _require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens must be at least 1")
        _require(self.max_model_len >= 2, "max_model_len must be at least 2")
        _require(0.0 <= self.kv_safety_margin < 1.0, "kv_safety_margin must be in [0, 1)")
        _require(
            self.aging_seconds is None or self.aging_seconds > 0,
            "aging_seconds must be positive, or None to disable aging",
        )
        _require(
            self.long_prefill_token_threshold >= 0, "long_prefill_token_threshold must be >= 0"
        )
        _require(self.max_pending_kv_events >= 1, "max_pending_kv_events must be at least 1")
        capacity = self.num_usable_blocks * self.block_size
        _require(
            self.max_model_len <= capacity,
            f"max_model_len {self.max_model_len} does not fit in the KV cache "
            f"({self.num_usable_blocks} usable blocks x {self.block_size} = {capacity} tokens); "
            "raise num_blocks or lower max_model_len",
        )

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_margin_blocks(self) -> int:
        """Blocks that admission leaves free so running decodes can grow."""
        return math.ceil(self.kv_safety_margin * self.num_usable_blocks)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
