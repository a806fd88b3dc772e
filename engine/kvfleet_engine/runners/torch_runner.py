"""The torch runner: real weights, a paged KV cache, one forward pass per step."""

from __future__ import annotations

import time

import torch

from kvfleet_engine.core.runner_base import StepBatch
from kvfleet_engine.model.llama import LlamaModel
from kvfleet_engine.model.paged_attention import PagedAttention, PagedKVCache, build_step_meta
from kvfleet_engine.model.sampler import Sampler

BYTE_VIEWS = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # bf16 has no numpy dtype


class TorchRunner:
    """Implements runner_base.Runner over a LlamaModel."""

    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int,
                 seed: int | None = None) -> None:
        self.model = model.eval()
        model.prepare_kernels()
        self.block_size, self.num_blocks = block_size, num_blocks
        self.kv = PagedKVCache(model.config, num_blocks, block_size, model.dtype)
        self.sampler = Sampler(seed)
        self.vocab_size = model.config.vocab_size
        self.last_prepare_s = 0.0  # host-side batch preparation in the last step, for benchmarks

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> dict[str, int]:
        seqs = batch.seqs
        if not seqs:
            return {}
        t0 = time.perf_counter()
        vocab = self.model.config.vocab_size
        meta = build_step_meta([len(s.token_ids) for s in seqs], [s.start_pos for s in seqs],
                               [s.block_table for s in seqs], self.block_size,
                               self.model.config.num_queries_per_kv, self.num_blocks)
        input_ids = torch.tensor([t for s in seqs for t in s.token_ids], dtype=torch.long)
        if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
            raise ValueError(f"token id out of range [0, {vocab})")
        self.last_prepare_s = time.perf_counter() - t0
        hidden = self.model(input_ids, meta.positions, PagedAttention(self.kv, meta))
        sampled = [i for i, s in enumerate(seqs) if s.do_sample]
        if not sampled:
            return {}
        rows = meta.last_token_index.index_select(0, torch.tensor(sampled, dtype=torch.long))
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        tokens = self.sampler.sample(logits, [seqs[i].params for i in sampled],
                                     [seqs[i].num_output_tokens for i in sampled])
        return {seqs[i].request_id: tok for i, tok in zip(sampled, tokens, strict=True)}

    def release(self, request_id: str) -> None:
        """Nothing to forget: seeded sampling is stateless per (seed, offset)."""
        del request_id

    # --- P/D transfer: a block's K and V of every layer, as raw bytes ---

    def kv_block_shape(self) -> tuple[str, list[int]]:
        d = self.kv.data
        dtype = str(d.dtype).removeprefix("torch.")
        return dtype, [d.shape[0], 2, *d.shape[3:]]

    def _check_ids(self, block_ids: list[int]) -> torch.Tensor:
        if any(not 0 <= b < self.num_blocks for b in block_ids):
            raise ValueError(f"block id out of range [0, {self.num_blocks})")
        return torch.tensor(block_ids, dtype=torch.long)

    def read_blocks(self, block_ids: list[int]) -> bytes:
        ids = self._check_ids(block_ids)
        blocks = self.kv.data[:, :, ids].permute(2, 0, 1, 3, 4, 5).contiguous()
        raw = blocks.view(BYTE_VIEWS[blocks.element_size()])
        return raw.numpy().tobytes()

    def write_blocks(self, block_ids: list[int], data: bytes) -> None:
        ids = self._check_ids(block_ids)
        d = self.kv.data
        shape = [len(block_ids), d.shape[0], 2, *d.shape[3:]]
        expected = d.element_size() * int(torch.Size(shape).numel())
        if len(data) != expected:
            raise ValueError(f"KV payload has {len(data)} bytes, expected {expected} "
                             f"for {len(block_ids)} blocks")
        raw = torch.frombuffer(bytearray(data), dtype=BYTE_VIEWS[d.element_size()])
        blocks = raw.view(d.dtype).view(shape).permute(1, 2, 0, 3, 4, 5)
        d[:, :, ids] = blocks
