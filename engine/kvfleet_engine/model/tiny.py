"""A tiny random-weight Llama with a fixed seed, for tests and benchmarks.

Weights are scaled like a trained net's (unit-variance activations) so that logits are
well separated and greedy outputs do not hinge on float rounding.
"""

from __future__ import annotations

import torch

from kvfleet_engine.model.config import ModelConfig
from kvfleet_engine.model.llama import LlamaModel
from kvfleet_engine.model.tokenizer import ByteTokenizer


def tiny_config(**overrides: object) -> ModelConfig:
    base: dict[str, object] = dict(
        vocab_size=ByteTokenizer.VOCAB_SIZE, hidden_size=64, intermediate_size=160,
        # head_dim 32 (not 64 / 4): vLLM's CPU attention needs >= 32, and it exercises
        # checkpoints whose head_dim is set apart from hidden_size.
        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10000.0,
        max_position_embeddings=4096, is_tied_embedding=False)
    base.update(overrides)
    return ModelConfig(**base)  # type: ignore[arg-type]


def build_tiny_random(seed: int = 0, dtype: torch.dtype = torch.float32,
                      config: ModelConfig | None = None) -> LlamaModel:
    cfg = config or tiny_config()
    model = LlamaModel(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
            elif name == "embed_tokens.weight":
                param.copy_(torch.randn(param.shape, generator=gen))
            else:
                fan_in = param.shape[-1]
                param.copy_(torch.randn(param.shape, generator=gen) / fan_in**0.5)
        if model.lm_head is not None:
            model.lm_head.weight.mul_(2.0)  # sharper logits: fewer near-ties
    return model.to(dtype).eval()
