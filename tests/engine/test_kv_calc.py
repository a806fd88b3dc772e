"""KV-size arithmetic, including the Llama-3-70B example and what "586 MB" really is."""

import pytest
from kvfleet_engine.core.kv_calc import (
    MB,
    MIB,
    kv_bytes_per_token,
    kv_cache_bytes,
    num_blocks_for_bytes,
)

LLAMA3_70B = dict(num_layers=80, num_kv_heads=8, head_dim=128, dtype_bytes=2)


def test_formula_is_two_times_layers_heads_dim_tokens_bytes():
    assert kv_cache_bytes(num_layers=3, num_kv_heads=5, head_dim=7, num_tokens=11,
                          dtype_bytes=2) == 2 * 3 * 5 * 7 * 11 * 2


def test_llama3_70b_fp16_per_token_and_1500_tokens():
    assert kv_bytes_per_token(**LLAMA3_70B) == 327_680  # 320 KiB
    total = kv_cache_bytes(num_tokens=1500, **LLAMA3_70B)
    assert total == 491_520_000
    assert total / MB == pytest.approx(491.52)
    assert total / MIB == pytest.approx(468.75)


def test_the_quoted_586_mb_is_1875_tokens_in_mib():
    # neither unit gives 586 for 1,500 tokens; 1,500 x 1.25 = 1,875 tokens does, in MiB
    assert round(kv_cache_bytes(num_tokens=1875, **LLAMA3_70B) / MIB) == 586
    assert round(kv_cache_bytes(num_tokens=1500, **LLAMA3_70B) / MIB) != 586
    assert round(kv_cache_bytes(num_tokens=1500, **LLAMA3_70B) / MB) != 586


def test_blocks_for_a_memory_budget():
    per_block = kv_bytes_per_token(**LLAMA3_70B) * 16
    assert num_blocks_for_bytes(per_block * 10 + 1, block_size=16, **LLAMA3_70B) == 10
    assert num_blocks_for_bytes(per_block - 1, block_size=16, **LLAMA3_70B) == 0


@pytest.mark.parametrize("field", ["num_layers", "num_kv_heads", "head_dim", "dtype_bytes"])
def test_rejects_non_positive_sizes(field):
    args = dict(LLAMA3_70B, num_tokens=1)
    args[field] = 0
    with pytest.raises(ValueError, match=field):
        kv_cache_bytes(**args)
    with pytest.raises(ValueError, match="num_tokens"):
        kv_cache_bytes(num_tokens=-1, **LLAMA3_70B)


@pytest.mark.parametrize("dtype_name, dtype_bytes", [("float32", 4), ("bfloat16", 2)])
def test_agrees_with_the_torch_runners_allocated_tensors(dtype_name, dtype_bytes):
    torch = pytest.importorskip("torch")
    from kvfleet_engine.model.paged_attention import PagedKVCache
    from kvfleet_engine.model.tiny import tiny_config

    cfg = tiny_config()
    cache = PagedKVCache(cfg, num_blocks=10, block_size=16, dtype=getattr(torch, dtype_name))
    expected = kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 10 * 16,
                              dtype_bytes)
    assert cache.num_bytes == expected
    per_block = kv_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype_bytes)
    assert num_blocks_for_bytes(cache.num_bytes, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                dtype_bytes, block_size=16) == 10
    assert per_block * 16 * 10 == cache.num_bytes
