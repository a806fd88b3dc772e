"""Which endpoint holds which prompt prefix: pure, in-memory, importable without I/O.

Two indexes share one structure (`ChainIndex`): per-endpoint LRU sets of chained block
hashes, plus a reverse map hash -> endpoints so a lookup costs O(prompt blocks).

* Approximate (`ApproxPrefixIndex`): the router hashes the prompt's UTF-8 bytes in fixed
  chunks of `block_bytes` into a chain h_k = H(h_{k-1}, chunk_k) (only full chunks), and
  records the chain for the endpoint it picked. No tokenizer on the hot path.
      idx = ApproxPrefixIndex(block_bytes=64, max_blocks_per_endpoint=65536)
      hashes = idx.hash_text(prompt_text)
      matched = idx.match(hashes)          # {endpoint: leading blocks matched}
      idx.record("e0", hashes)             # after picking e0
* Precise (`PreciseKVIndex`): fed by an engine's KV events (contract.KVEvent). Engine block
  hashes are over token ids with the engine's own hash function, which the router does not
  reproduce. Instead it re-hashes each stored block's `token_ids` with its own chain
  (`hash_tokens`) and keeps engine-hash -> router-hash per endpoint for removals. A request
  can use the precise index only when it carries token ids (`prompt` as a list of ints);
  text prompts fall back to the approximate index, which is always recorded as well.
      pidx.apply("e0", event)              # BlockStored / BlockRemoved / AllBlocksCleared
      pidx.match(pidx.hash_tokens(token_ids, block_size))
      pidx.engine_hashes("e0", router_hashes[:n])   # the engine's own hashes (peer hints)

`match` returns the number of *leading* blocks each endpoint holds, because a prefix cache
can only reuse a contiguous prefix.

H is Python's 64-bit `hash` of (parent, chunk): C speed on the hot path. It is seeded per
process, which is fine for an index that lives only in this process's memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvfleet_engine.contract import KVEvent

_ROOT = 0x6B7666_6C656574  # "kvfleet": the parent of a first block


class ChainIndex:
    """Per-endpoint LRU sets of block hashes with a reverse map for fast matching.

    The reverse map's values are immutable owner sets, and a hash with one owner (the common
    case) shares that endpoint's one interned `frozenset({endpoint})`: recording a new block
    allocates nothing but its dict slots, so large indexes cost no garbage-collector work."""

    def __init__(self, max_blocks_per_endpoint: int) -> None:
        if max_blocks_per_endpoint < 1:
            raise ValueError("max_blocks_per_endpoint must be >= 1")
        self.max_blocks_per_endpoint = max_blocks_per_endpoint
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._owners: dict[int, frozenset[str]] = {}
        self._solo: dict[str, frozenset[str]] = {}  # endpoint -> frozenset({endpoint})

    def _solo_of(self, endpoint: str) -> frozenset[str]:
        solo = self._solo.get(endpoint)
        if solo is None:
            solo = self._solo[endpoint] = frozenset((endpoint,))
        return solo

    def record(self, endpoint: str, hashes: list[int]) -> None:
        """Insert or refresh a chain. Last block first, so the LRU evicts a chain's tail
        before its head: a kept head still matches, a kept tail never could."""
        lru = self._lru.get(endpoint)
        if lru is None:
            lru = self._lru[endpoint] = OrderedDict()
        solo = self._solo_of(endpoint)
        owners_of, move = self._owners, lru.move_to_end  # hot loop: locals, no helper calls
        for h in reversed(hashes):
            if h in lru:
                move(h)
                continue
            lru[h] = None
            owners = owners_of.get(h)
            owners_of[h] = solo if owners is None else owners | solo
        pop = lru.popitem
        for _ in range(len(lru) - self.max_blocks_per_endpoint):
            old, _ = pop(last=False)
            owners = owners_of[old]
            if owners is solo:
                del owners_of[old]
            else:
                self._drop_owner(old, endpoint)

    def remove(self, endpoint: str, hashes: Iterable[int]) -> None:
        lru = self._lru.get(endpoint)
        if lru is None:
            return
        for h in hashes:
            if h in lru:
                del lru[h]
                self._drop_owner(h, endpoint)

    def forget_endpoint(self, endpoint: str) -> None:
        for h in self._lru.pop(endpoint, OrderedDict()):
            self._drop_owner(h, endpoint)
        self._solo.pop(endpoint, None)  # endpoints come and go: keep none that left

    def match(self, hashes: list[int]) -> dict[str, int]:
        """endpoint -> number of leading blocks of `hashes` it holds (absent means 0)."""
        if not hashes:
            return {}
        first = self._owners.get(hashes[0])
        if not first:
            return {}
        result: dict[str, int] = {}
        alive = set(first)
        depth = 1
        for depth in range(1, len(hashes)):
            owners = self._owners.get(hashes[depth])
            if owners is None:
                break
            if not alive <= owners:  # someone's prefix ends here (the rare, costly case)
                for ep in alive - owners:
                    result[ep] = depth
                alive &= owners
                if not alive:
                    break
        else:
            depth = len(hashes)
        for ep in alive:
            result[ep] = depth
        return result

    def num_blocks(self, endpoint: str) -> int:
        return len(self._lru.get(endpoint, ()))

    def endpoints(self) -> list[str]:
        return list(self._lru)

    def blocks_newest_first(self, endpoint: str) -> list[int]:
        """An endpoint's blocks, most recently used first: `record(endpoint, this)` in
        another index rebuilds the same LRU order (exchange.py's snapshot)."""
        return list(reversed(self._lru.get(endpoint, ())))

    def _drop_owner(self, h: int, endpoint: str) -> None:
        owners = self._owners.get(h)
        if owners is None or endpoint not in owners:
            return
        rest = owners - self._solo_of(endpoint)
        if not rest:
            del self._owners[h]
        elif len(rest) == 1:
            self._owners[h] = self._solo_of(next(iter(rest)))
        else:
            self._owners[h] = rest


class ApproxPrefixIndex(ChainIndex):
    def __init__(self, block_bytes: int = 64, max_blocks_per_endpoint: int = 65536) -> None:
        super().__init__(max_blocks_per_endpoint)
        if block_bytes < 1:
            raise ValueError("block_bytes must be >= 1")
        self.block_bytes = block_bytes

    def hash_text(self, text: str) -> list[int]:
        return self.hash_bytes(text.encode("utf-8", "surrogatepass"))

    def hash_bytes(self, data: bytes) -> list[int]:
        h = _ROOT
        step = self.block_bytes
        return [h := hash((h, data[start:start + step]))
                for start in range(0, len(data) - step + 1, step)]


def hash_tokens(token_ids: list[int], block_size: int) -> list[int]:
    """Router-side chained hashes of full token blocks (independent of the engine's hash)."""
    h = _ROOT
    return [h := hash((h, tuple(token_ids[start:start + block_size])))
            for start in range(0, len(token_ids) - block_size + 1, block_size)]


class PreciseKVIndex(ChainIndex):
    """Exact per-endpoint view of engines' prefix caches, from KV events."""

    def __init__(self, max_blocks_per_endpoint: int = 1_000_000) -> None:
        super().__init__(max_blocks_per_endpoint)
        self._engine_to_router: dict[str, dict[int, int]] = {}
        self._router_to_engine: dict[str, dict[int, int]] = {}
        self.block_sizes: dict[str, int] = {}
        self.last_seq: dict[str, int] = {}

    def apply(self, endpoint: str, event: KVEvent) -> bool:
        """Apply one event; False when a sequence gap means the index was reset."""
        is_in_order = True
        last = self.last_seq.get(endpoint)
        if last is not None and event.seq != last + 1:
            self.reset(endpoint)
            is_in_order = False
        self.last_seq[endpoint] = event.seq
        mapping = self._engine_to_router.setdefault(endpoint, {})
        if event.type == "AllBlocksCleared":
            self.reset(endpoint)
            self.last_seq[endpoint] = event.seq
        elif event.type == "BlockRemoved":
            gone = [mapping.pop(h) for h in event.block_hashes if h in mapping]
            reverse = self._router_to_engine.get(endpoint, {})
            for h in gone:
                reverse.pop(h, None)
            self.remove(endpoint, gone)
        elif event.type == "BlockStored":
            self._store(endpoint, event, mapping)
        return is_in_order

    def engine_hashes(self, endpoint: str, hashes: list[int]) -> list[int] | None:
        """The engine's own block hashes (its KV events' values) of router chain `hashes`
        on `endpoint`, or None when any of them is not known there."""
        reverse = self._router_to_engine.get(endpoint, {})
        out = [reverse.get(h) for h in hashes]
        return None if None in out else out  # type: ignore[return-value]

    def _store(self, endpoint: str, event: KVEvent, mapping: dict[int, int]) -> None:
        size = event.block_size
        if size < 1 or len(event.token_ids) < size * len(event.block_hashes):
            return  # cannot re-hash without the tokens
        self.block_sizes[endpoint] = size
        if event.parent_block_hash is None:
            parent = _ROOT
        elif event.parent_block_hash in mapping:
            parent = mapping[event.parent_block_hash]
        else:
            return  # parent unknown (before we subscribed): the chain cannot be placed
        hashes: list[int] = []
        reverse = self._router_to_engine.setdefault(endpoint, {})
        for i, engine_hash in enumerate(event.block_hashes):
            tokens = event.token_ids[i * size:(i + 1) * size]
            parent = hash((parent, tuple(tokens)))
            mapping[engine_hash] = parent
            reverse[parent] = engine_hash
            hashes.append(parent)
        self.record(endpoint, hashes)

    def reset(self, endpoint: str) -> None:
        self.forget_endpoint(endpoint)
        self._engine_to_router.pop(endpoint, None)
        self._router_to_engine.pop(endpoint, None)
        self.last_seq.pop(endpoint, None)

    hash_tokens = staticmethod(hash_tokens)
