"""KV-cache size arithmetic: 2 (K and V) x layers x kv_heads x head_dim x tokens x bytes.

The Llama-3-70B example (80 layers, 8 KV heads, head dim 128, FP16):
  per token 2 * 80 * 8 * 128 * 2 = 327,680 bytes (320 KiB);
  1,500 tokens -> 491,520,000 bytes = 491.52 MB (decimal) = 468.75 MiB.
The often-quoted "586 MB" is neither unit for 1,500 tokens: it is 1,875 tokens in MiB
(1,875 * 327,680 = 614,400,000 bytes = 585.94 MiB), i.e. 1,500 * 1.25 tokens, as when
1,500 *words* are counted at 1.25 tokens per word. tests/engine/test_kv_calc.py pins both.
"""

from __future__ import annotations

MB = 10**6
MIB = 2**20


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("dtype_bytes", dtype_bytes)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int, dtype_bytes: int
) -> int:
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes) * num_tokens


def num_blocks_for_bytes(
    budget_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int,
    block_size: int,
) -> int:
    """How many KV blocks of `block_size` tokens fit in `budget_bytes`."""
    per_block = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes) * block_size
    return max(0, budget_bytes // per_block)
