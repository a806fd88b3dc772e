"""A fixed pool of KV blocks with reference counts and a verified prefix cache.

No torch here: this is bookkeeping over block ids. Block 0 is the null block and is
never handed out (runners may point padding at it).

- A block with ref_cnt > 0 is in use by one or more requests.
- A block with ref_cnt == 0 sits in the free queue, in LRU order (first out = evicted
  first). If it carries a hash it is still a prefix-cache entry and can be revived by a
  hit until it is handed out again, at which point its hash is evicted (BlockRemoved).
- Never-used blocks come first, in id order; each gets its `KVBlock` when first handed
  out, so a pool costs memory for the blocks it has used, not for its size (the
  simulator runs a thousand pools of 25,000 blocks).
- Cache entries are keyed by a chained hash (parent hash + the block's tokens) and a hit
  is checked against the stored tokens and parent, so a hash collision never aliases.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence

from kvfleet_engine.contract import KVEvent

NULL_BLOCK_ID = 0
_ROOT = b"kvfleet-root-0000"[:8]


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """Chained hash of one full block: blake2b-64 of the parent hash and the token ids.

    Stable across processes and machines (no PYTHONHASHSEED), masked to 63 bits so it
    survives JSON readers that use signed 64-bit integers.
    """
    h = hashlib.blake2b(digest_size=8)
    h.update(_ROOT if parent_hash is None else parent_hash.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return int.from_bytes(h.digest(), "little") & 0x7FFF_FFFF_FFFF_FFFF


class KVBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "parent_hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        self.parent_hash: int | None = None
        self.token_ids = b""  # the block's tokens as int64s: a quarter of a tuple of ints

    def tokens(self) -> list[int]:
        """The token ids of a cached block ([] when it is not a cache entry)."""
        return array("q", self.token_ids).tolist()

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool = True,
        clock: Callable[[], float] | None = None,
        max_pending_events: int = 100_000,
    ) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is reserved)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        # Blocks handed out at least once, by id: ids come out fresh in order, so this grows
        # by appending. Ids from len(self.blocks) up are never-used and free.
        self.blocks = [KVBlock(NULL_BLOCK_ID)]
        self.blocks[NULL_BLOCK_ID].ref_cnt = 1  # pinned forever
        self._free: OrderedDict[int, KVBlock] = OrderedDict()  # used once, now free: LRU
        self._cached: dict[int, KVBlock] = {}
        self._clock = clock
        self._events: deque[KVEvent] = deque(maxlen=max_pending_events)
        self._next_event_seq = 0

    # --- capacity ---

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (never-used, freed, or evictable cached)."""
        return len(self._free) + self.num_blocks - len(self.blocks)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        """Fraction of usable blocks held by requests (evictable cached blocks count free)."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    # --- prefix cache ---

    def lookup(
        self, block_hash: int, parent_hash: int | None, token_ids: Sequence[int]
    ) -> KVBlock | None:
        block = self._cached.get(block_hash)
        if block is None or block.parent_hash != parent_hash \
                or block.token_ids != array("q", token_ids).tobytes():  # fmt: skip
            return None
        return block

    def cached_block(self, block_hash: int) -> KVBlock | None:
        """The block serving this hash, unverified (a peer export checks the parent chain)."""
        return self._cached.get(block_hash)

    def cache_blocks(
        self,
        blocks: Sequence[KVBlock],
        hashes: Sequence[int],
        parent_hash: int | None,
        token_chunks: Sequence[Sequence[int]],
    ) -> int:
        """Register consecutive full blocks of one request; returns how many became entries.

        A hash already served by another block is skipped (that block stays the entry),
        so one hash always maps to one block.
        """
        stored: list[int] = []
        stored_tokens: list[int] = []
        first_parent = parent_hash
        parent = parent_hash
        for block, block_hash, tokens in zip(blocks, hashes, token_chunks, strict=True):
            if block.block_hash is None and block_hash not in self._cached:
                block.block_hash = block_hash
                block.parent_hash = parent
                block.token_ids = array("q", tokens).tobytes()
                self._cached[block_hash] = block
                if not stored:
                    first_parent = parent
                stored.append(block_hash)
                stored_tokens.extend(tokens)
            elif stored:  # a gap: flush so each event covers one contiguous chain
                self._emit_stored(stored, first_parent, stored_tokens)
                stored, stored_tokens = [], []
            parent = block_hash
        if stored:
            self._emit_stored(stored, first_parent, stored_tokens)
        return len(stored)

    # --- allocation ---

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on (possibly free, cached) blocks: a prefix hit."""
        free = self._free
        for block in blocks:
            if block.ref_cnt == 0:
                del free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, num_blocks: int) -> list[KVBlock]:
        """Hand out `num_blocks`: never-used ones first, then the least recently freed, whose
        hashes are evicted."""
        num_free = self.num_free_blocks
        if num_blocks > num_free:
            raise ValueError(f"cannot allocate {num_blocks} blocks, {num_free} free")
        blocks = self.blocks
        num_fresh = min(num_blocks, self.num_blocks - len(blocks))
        out = [KVBlock(i) for i in range(len(blocks), len(blocks) + num_fresh)]
        blocks.extend(out)
        for block in out:
            block.ref_cnt = 1
        removed: list[int] = []
        popitem = self._free.popitem
        for _ in range(num_blocks - num_fresh):
            _, block = popitem(last=False)
            if block.block_hash is not None:
                removed.append(block.block_hash)
                del self._cached[block.block_hash]
                block.block_hash = None
                block.parent_hash = None
                block.token_ids = b""
            block.ref_cnt = 1
            out.append(block)
        if removed:
            self._emit(KVEvent(seq=0, type="BlockRemoved", block_hashes=removed))
        return out

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference each; blocks reaching zero join the LRU tail in this order."""
        free = self._free
        for block in blocks:
            if block.ref_cnt <= 0 or block.block_id == NULL_BLOCK_ID:
                raise ValueError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                free[block.block_id] = block

    def free_block_ids_in_order(self) -> list[int]:
        """The free queue, first-evicted first (for tests and debugging)."""
        return [*range(len(self.blocks), self.num_blocks), *self._free]

    def ref_counts(self) -> list[int]:
        """Every block's reference count by id, never-used ones 0 (for tests)."""
        return [b.ref_cnt for b in self.blocks] + [0] * (self.num_blocks - len(self.blocks))

    # --- events ---

    def drain_events(self) -> list[KVEvent]:
        events = list(self._events)
        self._events.clear()
        return events

    def _emit_stored(self, hashes: list[int], parent: int | None, tokens: list[int]) -> None:
        self._emit(
            KVEvent(
                seq=0,
                type="BlockStored",
                block_hashes=hashes,
                parent_block_hash=parent,
                token_ids=tokens,
                block_size=self.block_size,
            )
        )

    def _emit(self, event: KVEvent) -> None:
        event.seq = self._next_event_seq
        self._next_event_seq += 1
        if self._clock is not None:
            event.timestamp = self._clock()
        self._events.append(event)
