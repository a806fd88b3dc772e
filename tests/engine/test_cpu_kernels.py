"""The fused CPU kernels against plain torch and a naive attention, and their fallbacks."""

import logging
import math
import random
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F
from kvfleet_engine.model import cpu_kernels, ops
from kvfleet_engine.model.paged_attention import PagedAttention, PagedKVCache, build_step_meta
from kvfleet_engine.model.reference import reference_greedy
from kvfleet_engine.model.tiny import build_tiny_random, tiny_config

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture
def torch_path():
    """Run a block with the kernels switched off; always switch them back on."""
    ops.use_kernels(False)
    yield
    ops.use_kernels(True)


@pytest.fixture
def fresh_load(monkeypatch):
    """load() is cached per process; clear it around tests that change how it builds."""
    cpu_kernels.load.cache_clear()
    yield monkeypatch
    cpu_kernels.load.cache_clear()


def _both(fn):
    """fn() with the kernels, then with plain torch."""
    assert ops.kernels(torch.zeros(1)) is not None, "kernel library did not load"
    fast = fn()
    ops.use_kernels(False)
    try:
        slow = fn()
    finally:
        ops.use_kernels(True)
    return fast, slow


def test_library_builds_here():
    assert shutil.which("g++"), "g++ is part of this project's toolchain"
    assert cpu_kernels.load() is not None


def test_loading_the_library_keeps_subnormal_floats():
    """A library linked with -ffast-math turns on flush-to-zero for the whole process."""
    assert cpu_kernels.load() is not None
    assert sys.float_info.min / 2 > 0
    assert torch.tensor(1e-40, dtype=torch.float32).item() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_torch(dtype, with_residual):
    x = torch.randn(37, 200).to(dtype)
    w = (1 + 0.1 * torch.randn(200)).to(dtype)
    res = torch.randn(37, 200).to(dtype)

    def run():
        r = res.clone() if with_residual else None
        out, r2 = ops.rms_norm(x, w, 1e-5, r)
        return out.float(), r2.float()

    (fast, fast_res), (slow, slow_res) = _both(run)
    assert torch.allclose(fast, slow, atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(fast_res, slow_res)  # the residual add rounds the same way
    if with_residual:
        assert torch.equal(fast_res, (x + res).float())
    else:
        assert torch.equal(fast_res, x.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_torch(dtype):
    gate_up = torch.randn(9, 2 * 160).to(dtype)
    fast, slow = _both(lambda: ops.silu_mul(gate_up).float())
    assert fast.shape == (9, 160)
    assert torch.allclose(fast, slow, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_in_place_on_a_strided_view_matches_torch(dtype):
    qkv = torch.randn(11, 7, 32).to(dtype)  # 4 q + 1 k heads rotate; 2 v heads do not
    positions = torch.tensor([0, 1, 2, 50, 51, 3, 4, 5, 6, 99, 7])
    cos = torch.randn(128, 16)
    sin = torch.randn(128, 16)

    def run():
        heads = qkv.clone()
        rotated = ops.rotate(heads[:, :5], positions, cos, sin)
        return torch.cat([rotated.float(), heads[:, 5:].float()], dim=1)

    fast, slow = _both(run)
    assert torch.allclose(fast, slow, atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(fast[:, 5:], qkv[:, 5:].float())  # v heads untouched


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 64])  # register tiles hold 6 rows
@pytest.mark.parametrize("n, k", [(70, 64), (33, 200), (128, 2)])  # 70, 33: partial tiles
def test_packed_linear_matches_torch(rows, n, k):
    x = torch.randn(rows, k).bfloat16()
    w = (torch.randn(n, k) / k ** 0.5).bfloat16()
    bias = torch.randn(n).bfloat16()
    packed = ops.PackedWeight().get(w)
    assert packed is not None
    got = ops.linear(x, w, bias, packed).double()
    exact = x.double() @ w.double().T + bias.double()
    assert torch.allclose(got, exact, atol=2e-2, rtol=1e-2)
    assert torch.allclose(got, F.linear(x, w, bias).double(), atol=2e-2, rtol=1e-2)
    assert torch.allclose(ops.linear(x[:0], w, bias, packed), torch.empty(0, n).bfloat16())


def test_packed_weight_follows_changes_and_skips_what_it_cannot_pack():
    cache = ops.PackedWeight()
    w = torch.randn(20, 8).bfloat16()
    x = torch.randn(3, 8).bfloat16()
    before = ops.linear(x, w, packed=cache.get(w)).clone()
    with torch.no_grad():
        w.mul_(2)  # in place, as a weight loader would
    after = ops.linear(x, w, packed=cache.get(w))
    assert torch.allclose(after.float(), 2 * before.float(), rtol=2e-2, atol=2e-2)
    with torch.inference_mode():  # a weight made under inference mode has no version
        frozen = torch.randn(20, 8).bfloat16()
    assert cache.get(frozen) is not None
    assert cache.get(torch.randn(4, 7).bfloat16()) is None  # odd input width
    assert cache.get(torch.randn(4, 8)) is None  # float32: plain F.linear


def _naive(q, k_seq, v_seq, start):
    """One sequence: q [n, h, d] at positions start.., against k/v [ctx, kv, d]."""
    group = q.shape[1] // k_seq.shape[1]
    k = k_seq.float().repeat_interleave(group, dim=1)
    v = v_seq.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), k) / math.sqrt(q.shape[2])
    ctx = k.shape[0]
    visible = torch.arange(ctx)[None, :] <= (start + torch.arange(q.shape[0]))[:, None]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hts,shd->thd", probs, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [32, 64, 128, 48])  # 48: the run-time head dim
def test_paged_attention_on_a_mixed_batch(dtype, head_dim):
    """Decodes and prefill chunks of many lengths, scattered blocks, one step."""
    cfg = tiny_config(num_heads=6, num_kv_heads=2, head_dim=head_dim, num_layers=1)
    block_size, rng = 4, random.Random(7)
    q_lens = [1, 1, 5, 17, 1, 40, 3]
    starts = [0, 9, 0, 6, 33, 2, 13]
    ctx = [s + q for s, q in zip(starts, q_lens, strict=True)]
    need = [-(-c // block_size) for c in ctx]
    ids = list(range(1, 1 + sum(need)))
    rng.shuffle(ids)  # paging must not assume contiguous or ordered blocks
    tables, i = [], 0
    for n in need:
        tables.append(ids[i:i + n])
        i += n
    k_seqs = [torch.randn(c, 2, head_dim).to(dtype) for c in ctx]
    v_seqs = [torch.randn(c, 2, head_dim).to(dtype) for c in ctx]

    def slot(b, t):
        return tables[b][t // block_size], t % block_size

    def cache_with_history():  # earlier tokens only: this step's K/V must be written by it
        cache = PagedKVCache(cfg, 1 + sum(need), block_size, dtype)
        for b, start in enumerate(starts):
            for t in range(start):
                cache.key(0)[slot(b, t)], cache.value(0)[slot(b, t)] = k_seqs[b][t], v_seqs[b][t]
        return cache

    meta = build_step_meta(q_lens, starts, tables, block_size, 3, 1 + sum(need))
    heads = torch.randn(sum(q_lens), 6 + 2 + 2, head_dim).to(dtype)
    heads[:, 6:8] = torch.cat([k[s:] for k, s in zip(k_seqs, starts, strict=True)])
    heads[:, 8:] = torch.cat([v[s:] for v, s in zip(v_seqs, starts, strict=True)])
    q, k, v = heads[:, :6], heads[:, 6:8], heads[:, 8:]

    def run():
        cache = cache_with_history()
        out = PagedAttention(cache, meta)(0, q, k, v).float()
        for b, start in enumerate(starts):  # the new tokens landed in their slots
            for t in range(start, ctx[b]):
                assert torch.equal(cache.key(0)[slot(b, t)], k_seqs[b][t])
                assert torch.equal(cache.value(0)[slot(b, t)], v_seqs[b][t])
        return out

    fast, slow = _both(run)
    offsets = meta.q_start.tolist()
    expected = torch.cat([_naive(q[offsets[b]:offsets[b] + n], k_seqs[b], v_seqs[b], starts[b])
                          for b, n in enumerate(q_lens)])
    assert torch.allclose(fast, expected, atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.allclose(slow, expected, atol=TOL[dtype], rtol=TOL[dtype])


def test_engine_outputs_agree_with_and_without_kernels(torch_path):
    model = build_tiny_random(seed=0)
    prompt = list(range(3, 40))
    slow = reference_greedy(model, prompt, 12)
    ops.use_kernels(True)
    assert reference_greedy(model, prompt, 12) == slow


def test_disabled_by_environment(fresh_load):
    fresh_load.setenv("KVFLEET_CPU_KERNELS", "0")
    assert cpu_kernels.load() is None
    x = torch.randn(3, 8)
    assert ops.kernels(x) is None
    out, _ = ops.rms_norm(x, torch.ones(8), 1e-5)  # the torch path answers
    assert out.shape == (3, 8)


def test_failed_build_falls_back_with_a_warning(fresh_load, tmp_path, caplog):
    fresh_load.setenv("KVFLEET_KERNEL_DIR", str(tmp_path))
    fresh_load.setenv("CXX", "/bin/false")
    with caplog.at_level(logging.WARNING, logger="kvfleet_engine.model.cpu_kernels"):
        assert cpu_kernels.load() is None
    assert "plain torch ops" in caplog.text
    assert not list(tmp_path.iterdir())  # no half-built library left to load later


def test_unwritable_cache_folder_falls_back(fresh_load, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    fresh_load.setenv("KVFLEET_KERNEL_DIR", str(blocker / "kernels"))
    with caplog.at_level(logging.WARNING, logger="kvfleet_engine.model.cpu_kernels"):
        assert cpu_kernels.load() is None
    assert "no writable kernel cache folder" in caplog.text


def test_library_is_built_once_and_reused(fresh_load, tmp_path):
    fresh_load.setenv("KVFLEET_KERNEL_DIR", str(tmp_path))
    assert cpu_kernels.load() is not None
    built = list(tmp_path.glob("cpu_kernels-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    cpu_kernels.load.cache_clear()
    assert cpu_kernels.load() is not None
    assert built[0].stat().st_mtime_ns == stamp
