"""The torch runner on its own: mixed steps vs the reference, KV bytes, bad input."""

import pytest
import torch
from kvfleet_engine.core.kv_calc import kv_cache_bytes
from kvfleet_engine.core.runner_base import ScheduledSeq, StepBatch
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.model.reference import reference_next_logits
from kvfleet_engine.model.tiny import build_tiny_random
from kvfleet_engine.runners.torch_runner import TorchRunner

GREEDY = SamplingParams(max_tokens=8, temperature=0)


@pytest.fixture(scope="module")
def model():
    return build_tiny_random(seed=0)


def _seq(rid, tokens, start, table, do_sample=True, params=GREEDY, n_out=0):
    return ScheduledSeq(rid, list(tokens), start, table, do_sample, params, n_out)


def test_one_step_mixes_prefill_chunks_and_decodes(model):
    runner = TorchRunner(model, num_blocks=32, block_size=4)
    a, b, c = list(range(10, 23)), list(range(40, 47)), [200, 3, 99]
    tables = {"a": [5, 9, 2, 7], "b": [11, 3], "c": [20]}
    # step 1: a's first chunk (no sample), b whole, c whole
    out = runner.execute(StepBatch([_seq("a", a[:6], 0, tables["a"][:2], do_sample=False),
                                    _seq("b", b, 0, tables["b"]), _seq("c", c, 0, tables["c"])]))
    assert set(out) == {"b", "c"}
    assert out["b"] == int(reference_next_logits(model, b).argmax())
    assert out["c"] == int(reference_next_logits(model, c).argmax())
    # step 2: a's last chunk beside two decodes, in one forward pass
    b2, c2 = b + [out["b"]], c + [out["c"]]
    out2 = runner.execute(StepBatch([_seq("b", b2[-1:], len(b), tables["b"], n_out=1),
                                     _seq("a", a[6:], 6, tables["a"]),
                                     _seq("c", c2[-1:], len(c), tables["c"], n_out=1)]))
    for rid, toks in (("a", a), ("b", b2), ("c", c2)):
        assert out2[rid] == int(reference_next_logits(model, toks).argmax()), rid


def test_empty_batch_and_no_sample(model):
    runner = TorchRunner(model, num_blocks=8, block_size=4)
    assert runner.execute(StepBatch()) == {}
    assert runner.execute(StepBatch([_seq("x", [1, 2, 3], 0, [1], do_sample=False)])) == {}


@pytest.mark.parametrize("seq, message", [
    (_seq("x", [1, 2, 3, 4, 5], 0, [1]), "cannot hold"),
    (_seq("x", [1], 0, [99]), "block id out of range"),
    (_seq("x", [1000], 0, [1]), "token id out of range"),
    (_seq("x", [], 0, [1]), "at least one token"),
])
def test_bad_steps_raise_clear_errors(model, seq, message):
    runner = TorchRunner(model, num_blocks=8, block_size=4)
    with pytest.raises(ValueError, match=message):
        runner.execute(StepBatch([seq]))


def test_kv_allocation_matches_calculator(model):
    cfg = model.config
    runner = TorchRunner(model, num_blocks=10, block_size=8)
    assert runner.kv.num_bytes == kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                                 10 * 8, 4)
    assert runner.kv.num_bytes == cfg.kv_bytes_per_token(4) * 80


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_blocks_move_between_runners(dtype):
    model = build_tiny_random(seed=0, dtype=dtype)
    prompt = list(range(30, 43))  # 13 tokens: 3 full blocks + 1 partial
    src = TorchRunner(model, num_blocks=16, block_size=4)
    src.execute(StepBatch([_seq("p", prompt[:-1], 0, [3, 8, 1], do_sample=False)]))
    payload = src.read_blocks([3, 8, 1])
    name, shape = src.kv_block_shape()
    assert name == str(dtype).removeprefix("torch.")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    assert len(payload) == 3 * torch.Size(shape).numel() * itemsize
    dst = TorchRunner(model, num_blocks=16, block_size=4)
    dst.write_blocks([5, 6, 12], payload)
    assert dst.read_blocks([5, 6, 12]) == payload
    # decode continues on the destination as if it had computed the prefix itself
    here = src.execute(StepBatch([_seq("p", prompt[-1:], 12, [3, 8, 1, 2])]))
    there = dst.execute(StepBatch([_seq("p", prompt[-1:], 12, [5, 6, 12, 2])]))
    assert here == there


def test_write_blocks_rejects_wrong_sizes(model):
    runner = TorchRunner(model, num_blocks=8, block_size=4)
    payload = runner.read_blocks([1, 2])
    with pytest.raises(ValueError, match="expected"):
        runner.write_blocks([1], payload)
    with pytest.raises(ValueError, match="out of range"):
        runner.write_blocks([1, 8], payload)
    with pytest.raises(ValueError, match="out of range"):
        runner.read_blocks([-1])


def test_seeded_sampling_is_independent_of_batch(model):
    params = SamplingParams(max_tokens=4, temperature=1.5, seed=7)
    prompt = [5, 6, 7, 8, 9]
    alone = TorchRunner(model, num_blocks=16, block_size=4)
    crowd = TorchRunner(model, num_blocks=16, block_size=4, seed=1)
    x = alone.execute(StepBatch([_seq("s", prompt, 0, [1, 2], params=params, n_out=3)]))
    others = [_seq(f"o{i}", [i + 1, i + 2], 0, [3 + i], params=SamplingParams(temperature=1.0))
              for i in range(5)]
    y = crowd.execute(StepBatch([*others[:2], _seq("s", prompt, 0, [9, 10], params=params,
                                                   n_out=3), *others[2:]]))
    assert x["s"] == y["s"]
