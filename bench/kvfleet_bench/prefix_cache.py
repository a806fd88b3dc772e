"""The fake backends' prefix cache: an LRU of chained block hashes, bounded in blocks.

A "hit" is only ever a hit in this bounded cache (see shared/notes/peer-routers.md): an
unbounded "has seen this prefix" would let round-robin look good once every backend has
seen every prefix. Blocks are fixed runs of characters; only full blocks are cached, and a
prompt hits the longest run of its leading blocks that the cache holds, as an engine's
chained-hash prefix cache does.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class PrefixLookup:
    num_prompt_blocks: int
    num_hit_blocks: int


def chain_block_hashes(text: str, block_chars: int) -> list[int]:
    """Hash each full block together with its parent, so equal hashes mean equal prefixes."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(text) - block_chars + 1, block_chars):
        parent = hash((parent, text[start : start + block_chars]))
        hashes.append(parent)
    return hashes


class LRUPrefixCache:
    """At most `num_blocks` block hashes; a lookup also stores the prompt's blocks."""

    __slots__ = ("num_blocks", "block_chars", "_blocks")

    def __init__(self, num_blocks: int, block_chars: int) -> None:
        if num_blocks < 1 or block_chars < 1:
            raise ValueError("num_blocks and block_chars must be >= 1")
        self.num_blocks = num_blocks
        self.block_chars = block_chars
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup_and_store(self, text: str) -> PrefixLookup:
        hashes = chain_block_hashes(text, self.block_chars)
        num_hit = 0
        for h in hashes:
            if h not in self._blocks:
                break
            num_hit += 1
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.num_blocks:
            self._blocks.popitem(last=False)
        return PrefixLookup(num_prompt_blocks=len(hashes), num_hit_blocks=num_hit)

    def clear(self) -> None:
        self._blocks.clear()
