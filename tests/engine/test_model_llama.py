"""The decoder's pieces: config checks, RoPE scaling, paged forward vs the naive reference."""

import math

import pytest
import torch
from kvfleet_engine.model.config import RopeScaling
from kvfleet_engine.model.llama import LlamaModel
from kvfleet_engine.model.paged_attention import PagedAttention, PagedKVCache, build_step_meta
from kvfleet_engine.model.reference import naive_causal_attention, reference_next_logits
from kvfleet_engine.model.rope import apply_rotary, inverse_frequencies
from kvfleet_engine.model.tiny import build_tiny_random, tiny_config


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_heads=3, head_dim=0), "divisible"),
    (dict(num_kv_heads=3), "multiple of num_kv_heads"),
    (dict(num_layers=0), "num_layers must be positive"),
    (dict(rms_norm_eps=0.0), "positive"),
])
def test_config_rejects_bad_shapes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**kwargs)


def test_config_derives_head_dim_and_kv_bytes():
    cfg = tiny_config(head_dim=0)
    assert cfg.head_dim == 16 and cfg.num_queries_per_kv == 2
    assert cfg.kv_bytes_per_token(4) == 2 * 2 * 2 * 16 * 4
    assert tiny_config().head_dim == 32  # set apart from hidden_size / num_heads


def test_rope_scaling_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unsupported rope scaling"):
        RopeScaling("yarn")


def test_rope_linear_and_llama3_scaling():
    base = inverse_frequencies(128, 500000.0, None)
    linear = inverse_frequencies(128, 500000.0, RopeScaling("linear", factor=4.0))
    assert torch.allclose(linear, base / 4)
    s = RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)
    scaled = inverse_frequencies(128, 500000.0, s)
    wavelen = 2 * math.pi / base
    high = wavelen < 8192 / 4  # short wavelengths keep their frequency
    low = wavelen > 8192 / 1  # long ones are slowed by the factor
    assert torch.equal(scaled[high], base[high])
    assert torch.allclose(scaled[low], base[low] / 8)
    mid = ~high & ~low
    assert mid.any() and bool(((scaled[mid] < base[mid]) & (scaled[mid] > base[mid] / 8)).all())


def test_rotary_preserves_norm_and_relative_position():
    inv = inverse_frequencies(16, 10000.0, None)
    q, k = torch.randn(1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 16, dtype=torch.float64)

    def rot(x, pos):
        f = torch.tensor([[pos]], dtype=torch.float64) * inv
        return apply_rotary(x, f.cos()[:, None], f.sin()[:, None])

    assert torch.allclose(rot(q, 7).norm(), q.norm())
    # q.k depends only on the distance between positions.
    assert torch.allclose((rot(q, 10) * rot(k, 3)).sum(), (rot(q, 107) * rot(k, 100)).sum())


def _paged_logits(model: LlamaModel, tokens: list[int], block_size: int) -> torch.Tensor:
    num_blocks = len(tokens) // block_size + 2
    cache = PagedKVCache(model.config, num_blocks, block_size, model.dtype)
    table = list(range(num_blocks - 1, 0, -1))  # reversed ids: paging must not assume order
    meta = build_step_meta([len(tokens)], [0], [table], block_size,
                           model.config.num_queries_per_kv, num_blocks)
    with torch.inference_mode():
        hidden = model(torch.tensor(tokens), meta.positions, PagedAttention(cache, meta))
        return model.compute_logits(hidden[-1:])[0]


@pytest.mark.parametrize("overrides", [
    {}, {"is_tied_embedding": True}, {"is_qkv_biased": True}, {"num_kv_heads": 4},
    {"rope_scaling": RopeScaling("llama3", factor=8.0, original_max_position_embeddings=64)},
])
def test_paged_forward_matches_reference(overrides):
    model = build_tiny_random(seed=3, config=tiny_config(**overrides))
    tokens = list(range(5, 5 + 37))
    ref = reference_next_logits(model, tokens)
    assert torch.allclose(_paged_logits(model, tokens, block_size=4), ref, atol=1e-4)


def test_tiny_random_is_deterministic():
    a, b = build_tiny_random(seed=0), build_tiny_random(seed=0)
    c = build_tiny_random(seed=1)
    tokens = [1, 2, 3, 4]
    assert torch.equal(reference_next_logits(a, tokens), reference_next_logits(b, tokens))
    assert not torch.equal(reference_next_logits(a, tokens), reference_next_logits(c, tokens))


def test_naive_attention_is_causal():
    q, k, v = torch.randn(5, 4, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    out = naive_causal_attention(0, q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[3:], v2[3:] = 0, 0  # changing later tokens must not change earlier outputs
    assert torch.allclose(naive_causal_attention(0, q, k2, v2)[:3], out[:3])
    assert not torch.allclose(naive_causal_attention(0, q, k2, v2)[3:], out[3:])


def test_attention_groups_bucket_decodes_by_length():
    from kvfleet_engine.model.paged_attention import MIN_DECODE_GROUP, attention_groups

    n = MIN_DECODE_GROUP
    q_lens = [1] * (2 * n) + [5, 9]
    kv_blocks = [1] * n + [30] * n + [2, 3]
    groups = attention_groups(q_lens, kv_blocks)
    assert groups == [list(range(n)), list(range(n, 2 * n)), [2 * n], [2 * n + 1]]
    # prefill chunks of similar length share a call
    assert attention_groups([5, 7, 100], [2, 2, 30]) == [[0, 1], [2]]
    # a bucket too small to pay for its own call joins the next one up
    groups = attention_groups([1, 1, 1] + [1] * n, [1, 1, 1] + [40] * n)
    assert groups == [list(range(n + 3))]
    assert attention_groups([1, 1], [3, 200]) == [[0, 1]]
    assert sorted(sum(attention_groups(q_lens, kv_blocks), [])) == list(range(len(q_lens)))
