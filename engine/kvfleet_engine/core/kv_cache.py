"""The KV-cache manager: the narrow API between the scheduler and the block pool.

- `get_computed_blocks(request)`: the longest verified prefix-cache hit (no side effects).
- `allocate_slots(request, num_new_tokens, ...)`: blocks for the next tokens, or None
  when there is no room (the caller then preempts or waits). All or nothing.
- `free(request)`: give the request's blocks back; full ones stay cached, in LRU order.
- `cache_computed_blocks(request)`: after a step, register the blocks that became full
  of computed tokens. Registering only computed blocks means a hit never points at KV
  that a runner has not written yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvfleet_engine.contract import KVEvent
from kvfleet_engine.core.block_pool import BlockPool, KVBlock, hash_block_tokens
from kvfleet_engine.core.sequence import Request


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool = True,
        clock: Callable[[], float] | None = None,
        max_pending_events: int = 100_000,
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(
            num_blocks,
            block_size,
            enable_caching=enable_caching,
            clock=clock,
            max_pending_events=max_pending_events,
        )
        self.prefix_cache_queries = 0  # tokens looked up at admission (cumulative)
        self.prefix_cache_hits = 0  # tokens found (cumulative)

    # --- queries ---

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def block_hashes(self, request: Request, num_blocks: int) -> list[int]:
        """The chained hashes of the request's first `num_blocks` full blocks (memoised)."""
        hashes = request.block_hashes
        tokens = request.all_token_ids
        bs = self.block_size
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), num_blocks):
            parent = hash_block_tokens(parent, tokens[i * bs : (i + 1) * bs])
            hashes.append(parent)
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Cached blocks for the request's leading full blocks, and the tokens they cover.

        At least the last known token is left to compute, so the step that follows
        samples from fresh logits.
        """
        if not self.enable_caching:
            return [], 0
        bs = self.block_size
        num_candidates = (request.num_tokens - 1) // bs
        if num_candidates == 0:
            return [], 0
        hashes = self.block_hashes(request, num_candidates)
        tokens = request.all_token_ids
        lookup = self.pool.lookup
        hits: list[KVBlock] = []
        parent: int | None = None
        for i in range(num_candidates):
            block = lookup(hashes[i], parent, tokens[i * bs : (i + 1) * bs])
            if block is None:
                break
            hits.append(block)
            parent = hashes[i]
        return hits, len(hits) * bs

    def record_prefix_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_query_tokens
        self.prefix_cache_hits += num_hit_tokens

    # --- changes ---

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVBlock] = (),
        num_reserved_blocks: int = 0,
    ) -> list[int] | None:
        """Make room for `num_new_tokens` past the request's computed (and hit) tokens.

        `new_computed_blocks` are prefix hits from `get_computed_blocks`, appended to the
        block table first. Returns the ids of the newly allocated blocks, or None, with
        nothing changed, when fewer than `num_reserved_blocks` would stay free.
        """
        num_hit_tokens = len(new_computed_blocks) * self.block_size
        num_total = request.num_computed_tokens + num_hit_tokens + num_new_tokens
        num_have = len(request.block_ids) + len(new_computed_blocks)
        num_needed = cdiv(num_total, self.block_size) - num_have
        if num_needed < 0:
            num_needed = 0
        # hits that sit in the free queue stop being allocatable once we take them
        num_revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_needed + num_revived + num_reserved_blocks > self.pool.num_free_blocks:
            return None
        if new_computed_blocks:
            self.pool.touch(new_computed_blocks)
            request.block_ids.extend(b.block_id for b in new_computed_blocks)
            request.num_hashed_blocks = len(request.block_ids)
        if num_needed == 0:
            return []
        new_ids = [b.block_id for b in self.pool.allocate(num_needed)]
        request.block_ids.extend(new_ids)
        return new_ids

    def cache_computed_blocks(self, request: Request) -> None:
        """Register the request's blocks that are now full of computed tokens."""
        if not self.enable_caching:
            return
        bs = self.block_size
        num_full = request.num_computed_tokens // bs
        start = request.num_hashed_blocks
        if num_full <= start:
            return
        hashes = self.block_hashes(request, num_full)
        tokens = request.all_token_ids
        blocks = self.pool.blocks
        self.pool.cache_blocks(
            [blocks[i] for i in request.block_ids[start:num_full]],
            hashes[start:num_full],
            hashes[start - 1] if start else None,
            [tokens[i * bs : (i + 1) * bs] for i in range(start, num_full)],
        )
        request.num_hashed_blocks = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, so shared prefixes are evicted last."""
        blocks = self.pool.blocks
        self.pool.free(blocks[i] for i in reversed(request.block_ids))
        request.block_ids = []
        request.num_hashed_blocks = 0

    def drain_events(self) -> list[KVEvent]:
        return self.pool.drain_events()
