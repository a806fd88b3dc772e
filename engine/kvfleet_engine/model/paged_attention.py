"""Paged KV cache and batched attention over block tables (CPU).

With the fused CPU kernels loaded (model/cpu_kernels.py), one kernel call per layer
attends the whole flat batch, prefill chunks and decodes alike, reading K/V straight
through the block tables.

Without them, the torch path splits the batch into groups that share an SDPA call each:
single-token decodes and multi-token prefill chunks, bucketed by KV length. Each group
gathers its sequences' KV blocks into a padded tensor and runs one SDPA with a causal +
length mask. GQA is folded into the query axis, so K/V are never repeated.
"""

from __future__ import annotations

import array
import ctypes
import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvfleet_engine.model import ops
from kvfleet_engine.model.config import ModelConfig


class PagedKVCache:
    """K and V of all layers in one tensor [layers, 2, blocks, block_size, kv_heads, head_dim]."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.data = torch.zeros(cfg.num_layers, 2, num_blocks, block_size, cfg.num_kv_heads,
                                cfg.head_dim, dtype=dtype)

    def key(self, layer: int) -> torch.Tensor:
        return self.data[layer, 0]

    def value(self, layer: int) -> torch.Tensor:
        return self.data[layer, 1]

    @property
    def num_bytes(self) -> int:
        return self.data.numel() * self.data.element_size()


@dataclass(slots=True)
class GroupMeta:
    """Sequences that share one attention call: padded queries against gathered blocks."""

    token_index: torch.Tensor  # [B, max_q] rows of the flat batch (padding repeats a real row)
    is_real: torch.Tensor  # [B, max_q] False for padding queries
    block_tables: torch.Tensor  # [B, max_blocks]
    mask: torch.Tensor  # [B, 1, max_q * group, max_blocks * block_size], True = attend
    real_rows: torch.Tensor  # rows of the flattened [B * max_q] output that are real
    out_index: torch.Tensor  # flat-batch row of each real output row
    is_whole_batch: bool = False  # no padding, rows in flat order: output needs no scatter


@dataclass(slots=True)
class StepMeta:
    positions: torch.Tensor  # [T] absolute position of every token in the flat batch
    slot_mapping: torch.Tensor  # [T] flat cache slot each new token's K/V is written to
    last_token_index: torch.Tensor  # [B] flat row of each sequence's last token
    # For the kernel, int32: first flat row, query count and KV length (new tokens
    # included) of each sequence, and the block tables padded with block 0.
    q_start: torch.Tensor
    q_len: torch.Tensor
    ctx_len: torch.Tensor
    block_tables: torch.Tensor
    block_size: int
    queries_per_kv: int
    _groups: list[GroupMeta] | None = None

    @property
    def groups(self) -> list[GroupMeta]:
        """The torch path's SDPA groups, built on first use."""
        if self._groups is None:
            self._groups = build_groups(self)
        return self._groups


def pad_tables(tables: list[list[int]], dtype: torch.dtype = torch.long) -> torch.Tensor:
    """[B, max_blocks], padded with block 0 (reserved; reads of it are masked off)."""
    width = max(len(t) for t in tables)
    # Through a flat array: torch.tensor() on nested lists costs ~70 us at batch 64.
    flat = array.array("i" if dtype == torch.int32 else "q", itertools.chain.from_iterable(
        t if len(t) == width else t + [0] * (width - len(t)) for t in tables))
    return torch.frombuffer(flat, dtype=dtype).view(len(tables), width)


def build_group(q_len: torch.Tensor, start: torch.Tensor, offset: torch.Tensor,
                tables: torch.Tensor, block_size: int, queries_per_kv: int) -> GroupMeta:
    """offset: where each sequence's tokens begin in the flat batch."""
    step = torch.arange(int(q_len.max()))
    is_real = step[None, :] < q_len[:, None]
    last = torch.minimum(step[None, :], (q_len - 1)[:, None])  # padding repeats the last query
    num_blocks = int(((start + q_len + block_size - 1) // block_size).max())
    tables = tables[:, :num_blocks]
    kv_pos = torch.arange(num_blocks * block_size)
    q_pos = start[:, None] + last  # absolute position of each query
    mask = kv_pos[None, None, :] <= q_pos[:, :, None]  # causal; also hides unwritten slots
    mask = mask.repeat_interleave(queries_per_kv, dim=1).unsqueeze(1)
    token_index = offset[:, None] + last
    real_rows = is_real.flatten().nonzero().flatten()
    return GroupMeta(token_index, is_real, tables, mask, real_rows,
                     token_index.flatten().index_select(0, real_rows))


MIN_DECODE_GROUP = 8  # smaller length buckets merge upward: a kernel call costs too


def attention_groups(q_lens: list[int], kv_blocks: list[int]) -> list[list[int]]:
    """Split a step's sequences into attention calls that pad little.

    Sequences are bucketed by KV length in powers of two, so padding at most doubles the
    work of a call. Prefill chunks (more than one query) and decodes never share a call,
    since a decode padded to a long chunk's query length would waste the most. Decode
    buckets smaller than MIN_DECODE_GROUP merge into the next one up.
    """
    prefill: dict[int, list[int]] = {}
    for i, q in enumerate(q_lens):
        if q > 1:
            prefill.setdefault((kv_blocks[i] - 1).bit_length(), []).append(i)
    buckets: dict[int, list[int]] = {}
    for i, q in enumerate(q_lens):
        if q == 1:
            buckets.setdefault((kv_blocks[i] - 1).bit_length(), []).append(i)
    groups: list[list[int]] = []
    carry: list[int] = []
    for key in sorted(buckets):
        carry += buckets[key]
        if len(carry) >= MIN_DECODE_GROUP:
            groups.append(carry)
            carry = []
    if carry:
        if groups:
            groups[-1] += carry
        else:
            groups.append(carry)
    return groups + [prefill[key] for key in sorted(prefill)]


def build_step_meta(q_lens: list[int], starts: list[int], tables: list[list[int]],
                    block_size: int, queries_per_kv: int, num_blocks: int) -> StepMeta:
    # Plain Python lists, one torch.tensor each at the end: at decode batch sizes a dozen
    # small torch ops cost more than the loops (this runs once per step, not per layer).
    positions: list[int] = []
    slots: list[int] = []
    q_start: list[int] = []
    offset = 0
    for q, s, t in zip(q_lens, starts, tables, strict=True):
        if q < 1 or s < 0:
            raise ValueError("each scheduled sequence needs at least one token and start >= 0")
        if (s + q + block_size - 1) // block_size > len(t):
            raise ValueError(f"block table of {len(t)} blocks cannot hold {s + q} tokens")
        q_start.append(offset)
        offset += q
        if q == 1:  # a decode: most sequences of most steps
            positions.append(s)
            slots.append(t[s // block_size] * block_size + s % block_size)
        else:
            positions.extend(range(s, s + q))
            slots.extend(t[p // block_size] * block_size + p % block_size
                         for p in range(s, s + q))
    i32 = torch.int32
    block_tables = pad_tables(tables, i32)
    if int(block_tables.min()) < 0 or int(block_tables.max()) >= num_blocks:
        raise ValueError(f"block id out of range [0, {num_blocks})")
    return StepMeta(torch.tensor(positions, dtype=torch.long),
                    torch.tensor(slots, dtype=torch.long),
                    torch.tensor([o + q - 1 for o, q in zip(q_start, q_lens, strict=True)],
                                 dtype=torch.long),
                    torch.tensor(q_start, dtype=i32), torch.tensor(q_lens, dtype=i32),
                    torch.tensor([s + q for s, q in zip(starts, q_lens, strict=True)], dtype=i32),
                    block_tables, block_size, queries_per_kv)


def build_groups(meta: StepMeta) -> list[GroupMeta]:
    q_len, start = meta.q_len.long(), (meta.ctx_len - meta.q_len).long()
    offset, padded = meta.q_start.long(), meta.block_tables.long()
    block_size = meta.block_size
    kv_blocks = ((meta.ctx_len.long() + block_size - 1) // block_size).tolist()
    groups = []
    members: list[int] = []
    for members in attention_groups(q_len.tolist(), kv_blocks):
        idx = torch.tensor(members, dtype=torch.long)
        groups.append(build_group(q_len[idx], start[idx], offset[idx], padded[idx],
                                  block_size, meta.queries_per_kv))
    if len(groups) == 1 and bool(groups[0].is_real.all()) and members == sorted(members):
        groups[0].is_whole_batch = True  # one group, in order (all decodes, or one prompt)
    return groups


class PagedAttention:
    """AttentionFn for LlamaModel: write this step's K/V into the cache, attend through it."""

    def __init__(self, cache: PagedKVCache, meta: StepMeta) -> None:
        self.cache, self.meta = cache, meta

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = self.cache.key(layer_idx), self.cache.value(layer_idx)
        lib = ops.kernels(q)
        if lib is not None and k.stride() == v.stride() and k.stride(1) == k.shape[2]:
            return self._kernel_attention(lib, q, k, v, k_cache, v_cache)
        num_kv_heads, head_dim = k.shape[1], k.shape[2]
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, self.meta.slot_mapping, k)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, self.meta.slot_mapping, v)
        groups = self.meta.groups
        if groups[0].is_whole_batch:
            return _group_attention(q, k_cache, v_cache, groups[0])
        out = torch.empty_like(q)
        for g in groups:
            rows = _group_attention(q, k_cache, v_cache, g)
            out.index_copy_(0, g.out_index, rows.index_select(0, g.real_rows))
        return out

    def _kernel_attention(self, lib: ctypes.CDLL, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor) -> torch.Tensor:
        m, code = self.meta, ops.dtype_code(q)
        num_tokens, num_heads, head_dim = q.shape
        num_kv_heads = k.shape[1]
        lib.kvf_cache_write(code, k.data_ptr(), v.data_ptr(), k.stride(0), k_cache.data_ptr(),
                            v_cache.data_ptr(), m.slot_mapping.data_ptr(), num_tokens,
                            num_kv_heads * head_dim)
        out = q.new_empty(num_tokens, num_heads, head_dim)
        lib.kvf_paged_attention(code, q.data_ptr(), q.stride(0), out.data_ptr(),
                                num_heads * head_dim, k_cache.data_ptr(), v_cache.data_ptr(),
                                m.block_tables.data_ptr(), m.block_tables.shape[1],
                                m.q_start.data_ptr(), m.q_len.data_ptr(), m.ctx_len.data_ptr(),
                                m.q_len.shape[0], num_heads, num_kv_heads, head_dim,
                                m.block_size, head_dim ** -0.5)
        return out


def _group_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     g: GroupMeta) -> torch.Tensor:
    # index_select, not tensor[idx]: advanced indexing is ~100x slower on CPU here.
    batch, max_q = g.token_index.shape
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    kv_len = g.block_tables.shape[1] * block_size
    # [B, max_q, kv, group, d] -> [B, kv, max_q * group, d]: GQA as extra query rows.
    qg = q.index_select(0, g.token_index.flatten()).view(batch, max_q, num_kv_heads, group,
                                                         head_dim)
    qg = qg.permute(0, 2, 1, 3, 4).reshape(batch, num_kv_heads, max_q * group, head_dim)
    tables = g.block_tables.flatten()
    kg = k_cache.index_select(0, tables).view(batch, kv_len, num_kv_heads, head_dim)
    vg = v_cache.index_select(0, tables).view(batch, kv_len, num_kv_heads, head_dim)
    o = F.scaled_dot_product_attention(qg, kg.transpose(1, 2), vg.transpose(1, 2),
                                       attn_mask=g.mask)
    o = o.view(batch, num_kv_heads, max_q, group, head_dim).permute(0, 2, 1, 3, 4)
    return o.reshape(batch * max_q, num_heads, head_dim)
