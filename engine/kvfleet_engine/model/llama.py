"""Llama-family decoder over a flat batch of tokens.

Attention is pluggable: the paged runner and the naive reference pass different
`AttentionFn`s, so both run the very same projections, norms, RoPE and MLP.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from kvfleet_engine.model.config import ModelConfig
from kvfleet_engine.model.rope import Rotary, apply_rotary


class AttentionFn(Protocol):
    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        """q: [T, heads, d]; k, v: [T, kv_heads, d] (already rotated) -> [T, heads, d]."""
        ...


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 so bf16 activations do not lose the variance.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return normed.to(x.dtype) * self.weight


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # q, k and v fused into one matmul; gate and up likewise.
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.is_qkv_biased)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, layer_idx: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention: AttentionFn) -> torch.Tensor:
        num_tokens = x.shape[0]
        q_size, kv_size, _ = self.split
        qkv = self.qkv_proj(self.input_norm(x))
        # Rotate q and k heads in one go: they share cos/sin.
        qk = qkv[:, : q_size + kv_size].view(num_tokens, -1, self.head_dim)
        qk = apply_rotary(qk, cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, q_size + kv_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
        attn = attention(layer_idx, q, k, v).reshape(num_tokens, -1)
        x = x + self.o_proj(attn)
        gate, up = self.gate_up_proj(self.post_norm(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


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
                            else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        if not is_initialized:
            self.to_empty(device="cpu")
        self.to(dtype)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                             num_positions=min(cfg.max_position_embeddings, 4096))

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attention: AttentionFn) -> torch.Tensor:
        """Flat batch: input_ids and positions [T] -> final-normed hidden states [T, hidden]."""
        cos, sin = self.rotary.tables(positions, self.dtype)
        x = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer(i, x, cos, sin, attention)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()
