"""Llama-family decoder over a flat batch of tokens.

Attention is pluggable: the paged runner and the naive reference pass different
`AttentionFn`s, so both run the very same projections, norms, RoPE and MLP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from kvfleet_engine.model import ops
from kvfleet_engine.model.config import ModelConfig
from kvfleet_engine.model.rope import Rotary


class AttentionFn(Protocol):
    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        """q: [T, heads, d]; k, v: [T, kv_heads, d] (already rotated) -> [T, heads, d]."""
        ...


RopeFn = Callable[[torch.Tensor], torch.Tensor]  # [T, heads, d] -> rotated, this step's positions


class Linear(nn.Linear):
    """nn.Linear (same parameters and names) on kvfleet's fast linear path."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.packed = ops.PackedWeight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias, self.packed.get(self.weight))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x) or, with a residual, norm(residual += x), the residual stream)."""
        return ops.rms_norm(x, self.weight, self.eps, residual)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # q, k and v fused into one matmul; gate and up likewise.
        self.qkv_proj = Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.is_qkv_biased)
        self.o_proj = Linear(q_size, cfg.hidden_size, bias=False)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, layer_idx: int, x: torch.Tensor, residual: torch.Tensor | None,
                rope: RopeFn, attention: AttentionFn) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's output, not yet added to the residual stream (the add is
        fused into this layer's first norm). Returns (output, residual) likewise."""
        num_tokens = x.shape[0]
        h, residual = self.input_norm(x, residual)
        heads = self.qkv_proj(h).view(num_tokens, -1, self.head_dim)
        # Rotate q and k heads in one go: they share cos/sin.
        qk = rope(heads[:, : self.num_heads + self.num_kv_heads])
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads:]
        v = heads[:, self.num_heads + self.num_kv_heads:]
        attn = attention(layer_idx, q, k, v).reshape(num_tokens, -1)
        h, residual = self.post_norm(self.o_proj(attn), residual)
        return self.down_proj(ops.silu_mul(self.gate_up_proj(h))), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 is_initialized: bool = True) -> None:
        """is_initialized=False skips random init (memory is left empty) for loaders that
        overwrite every weight: initialising 100M+ parameters takes seconds on CPU."""
        super().__init__()
        self.config = cfg
        with torch.device("cpu" if is_initialized else "meta"):
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.lm_head = (None if cfg.is_tied_embedding
                            else Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        if not is_initialized:
            self.to_empty(device="cpu")
        self.to(dtype)
        self.packed_head = ops.PackedWeight()  # the logits GEMM over tied embeddings
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                             num_positions=min(cfg.max_position_embeddings, 4096))

    def prepare_kernels(self) -> None:
        """Build (once) and load the CPU kernels and pack the weights now, so that the first
        request does not pay for it."""
        ops.kernels(self.embed_tokens.weight)
        for module in self.modules():
            if isinstance(module, Linear):
                module.packed.get(module.weight)
        if self.lm_head is None:
            self.packed_head.get(self.embed_tokens.weight)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: AttentionFn) -> torch.Tensor:
        """Flat batch: input_ids and positions [T] -> final-normed hidden states [T, hidden]."""
        cos, sin = self.rotary.covering(positions)

        def rope(x: torch.Tensor) -> torch.Tensor:
            return ops.rotate(x, positions, cos, sin)

        x, residual = self.embed_tokens(input_ids), None
        for i, layer in enumerate(self.layers):
            x, residual = layer(i, x, residual, rope, attention)
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        weight = self.embed_tokens.weight
        return ops.linear(hidden, weight, packed=self.packed_head.get(weight)).float()
