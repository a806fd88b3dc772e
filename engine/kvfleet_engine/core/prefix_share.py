"""Prefix blocks shared between replicas: export a cached run, check it, install it.

No torch and no I/O: bookkeeping over the block pool, plus the runner's raw KV read and
write. The HTTP halves are `server/kv_export.py` (the peer) and `server/peer_fetch.py`.

- `export_run`: the longest leading run of the asked hashes that the pool still caches,
  chained from the root (each block's parent is the hash before it). The engine reads
  the run's KV in the same engine-thread command, so no step can evict a block between
  the lookup and the read: what leaves is consistent, or shorter, never stale.
- `check_export`: the importer's check of a peer's answer against the prompt's own
  chained hashes and tokens (the peer's hashes are never taken on trust) and against
  this cache's geometry and model.
- `install`: the blocks of a fetched prefix go into freshly allocated blocks (blocks this
  pool already caches are reused and their fetched bytes dropped), are registered as
  prefix-cache entries (BlockStored events announce them) and come back pinned, one
  reference each, so they survive until the request is admitted and hits them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvfleet_engine.core.block_pool import BlockPool, KVBlock, hash_block_tokens
from kvfleet_engine.core.kv_cache import KVCacheManager
from kvfleet_engine.core.kv_transfer import KVHeader, KVTransferError
from kvfleet_engine.core.runner_base import Runner
from kvfleet_engine.core.sequence import PrefixKV, Request


class PrefixMismatch(KVTransferError):
    """The peer's blocks are not this prompt's (wrong hashes or tokens)."""


@dataclass(slots=True)
class PrefixInstall:
    """What `LLMEngine.add_request` did with a fetched prefix."""

    num_written: int = 0  # fetched blocks written into this pool and registered
    num_local: int = 0  # leading blocks this pool cached already (their fetched bytes unused)
    is_no_room: bool = False  # too few free blocks: nothing was installed

    @property
    def num_blocks(self) -> int:
        return self.num_written + self.num_local


@dataclass(slots=True)
class ExportedPrefix:
    block_hashes: list[int]
    token_ids: list[int]
    data: bytes


def num_usable_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """Full prompt blocks a prefix hit may cover: the last prompt token is always computed."""
    return max(0, (num_prompt_tokens - 1) // block_size)


def chained_hashes(token_ids: Sequence[int], block_size: int, num_blocks: int) -> list[int]:
    """The chained hashes of the first `num_blocks` full blocks of `token_ids`."""
    out: list[int] = []
    parent: int | None = None
    for i in range(num_blocks):
        parent = hash_block_tokens(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


def num_agreeing(own: Sequence[int], claimed: Sequence[int]) -> int:
    """Length of the leading run where the claimed hashes equal the prompt's own."""
    n = 0
    for a, b in zip(own, claimed, strict=False):
        if a != b:
            break
        n += 1
    return n


def export_run(pool: BlockPool, block_hashes: Sequence[int], max_blocks: int) -> list[KVBlock]:
    run: list[KVBlock] = []
    parent: int | None = None
    for block_hash in block_hashes[:max_blocks]:
        block = pool.cached_block(block_hash)
        if block is None or block.parent_hash != parent:
            break
        run.append(block)
        parent = block_hash
    return run


def check_export(header: KVHeader, *, asked: Sequence[int], prompt_ids: Sequence[int],
                 dtype: str, block_shape: list[int], block_size: int, model: str) -> int:
    """The number of blocks in a peer's answer, once it checks out against the prompt.

    KVTransferError when it cannot fit this cache; PrefixMismatch when its blocks are not
    the leading blocks of this prompt."""
    if header.dtype != dtype or list(header.block_shape) != list(block_shape):
        raise KVTransferError(
            f"peer KV is {header.dtype}{header.block_shape}, this cache is {dtype}{block_shape}")
    if header.block_size != block_size:
        raise KVTransferError(f"peer block size {header.block_size} != local {block_size}")
    if header.model and model and header.model != model:
        raise KVTransferError(f"peer serves {header.model!r}, this replica {model!r}")
    n = header.num_blocks
    if n > len(asked) or len(header.block_hashes) != n or header.num_tokens != n * block_size \
            or len(header.token_ids) != header.num_tokens:
        raise KVTransferError(f"peer answered {n} blocks, {len(header.block_hashes)} hashes and "
                              f"{header.num_tokens} tokens for {len(asked)} blocks asked")
    if list(header.token_ids) != list(prompt_ids[:n * block_size]):
        raise PrefixMismatch("peer blocks hold other tokens than this prompt")
    recomputed = chained_hashes(header.token_ids, block_size, n)
    if recomputed != list(asked[:n]) or recomputed != list(header.block_hashes):
        raise PrefixMismatch("peer block hashes do not chain to this prompt's")
    return n


def install(kv: KVCacheManager, runner: Runner, request: Request, prefix: PrefixKV, *,
            num_reserved: int, max_pinned: int) -> tuple[PrefixInstall, list[KVBlock]]:
    """Install a fetched prefix for `request` (not yet scheduled); the pinned blocks."""
    bs = kv.block_size
    num_claimed = len(prefix.block_hashes)
    n = min(num_claimed, num_usable_blocks(request.num_tokens, bs))
    if not kv.enable_caching or n == 0 or len(prefix.data) % num_claimed:
        return PrefixInstall(), []
    own = kv.block_hashes(request, n)[:n]
    n = num_agreeing(own, prefix.block_hashes)
    own = own[:n]
    if n == 0:
        return PrefixInstall(), []
    pool = kv.pool
    tokens = request.all_token_ids
    chunks = [tokens[i * bs:(i + 1) * bs] for i in range(n)]
    found: list[KVBlock | None] = []
    parent: int | None = None
    for i in range(n):
        found.append(pool.lookup(own[i], parent, chunks[i]))
        parent = own[i]
    local = [b for b in found if b is not None]
    num_new = n - len(local)
    num_revived = sum(1 for b in local if b.ref_cnt == 0)
    if num_new + num_revived + num_reserved > pool.num_free_blocks or n > max_pinned:
        return PrefixInstall(is_no_room=True), []
    pool.touch(local)
    fresh = iter(pool.allocate(num_new))
    blocks = [b if b is not None else next(fresh) for b in found]
    if num_new:
        per_block = len(prefix.data) // num_claimed
        view = memoryview(prefix.data)
        new = [i for i, b in enumerate(found) if b is None]
        data = b"".join(view[i * per_block:(i + 1) * per_block] for i in new)
        try:
            runner.write_blocks([blocks[i].block_id for i in new], data)
        except (ValueError, RuntimeError):  # bytes this runner cannot take: install nothing
            pool.free(blocks)
            return PrefixInstall(), []
    pool.cache_blocks(blocks, own, None, chunks)
    return PrefixInstall(num_new, len(local)), blocks
