"""Batched sampler: greedy, temperature, top-k, top-p, per-request seeds."""

import torch
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.model.sampler import Sampler, filtered_probs, mix_seed


def _logits(rows=3, vocab=50, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_and_top_k_one_take_the_argmax():
    logits = _logits()
    params = [SamplingParams(temperature=0), SamplingParams(temperature=2.0, top_k=1),
              SamplingParams(temperature=0.7, top_p=1e-9)]
    assert Sampler(0).sample(logits, params, [0, 0, 0]) == logits.argmax(-1).tolist()


def test_top_k_and_top_p_restrict_the_support():
    logits = _logits(rows=1, vocab=20)
    top2 = set(logits[0].topk(2).indices.tolist())
    sampler = Sampler(0)
    picks = {sampler.sample(logits, [SamplingParams(temperature=5.0, top_k=2)], [0])[0]
             for _ in range(200)}
    assert picks == top2
    probs, ids = filtered_probs(logits.double(), torch.tensor([1.0], dtype=torch.float64),
                                torch.tensor([0]), torch.tensor([0.5], dtype=torch.float64))
    kept = probs[0] > 0
    full = logits[0].double().softmax(-1).sort(descending=True).values
    n = int(kept.sum())
    assert full[: n - 1].sum() < 0.5 <= full[:n].sum()  # smallest prefix reaching top_p
    assert torch.isclose(probs[0].sum(), torch.tensor(1.0, dtype=torch.float64))
    assert ids[0, 0] == logits[0].argmax()


def test_temperature_sampling_follows_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    params = SamplingParams(temperature=1.0, seed=3)
    sampler = Sampler(0)
    rows = 4000
    tokens = sampler.sample(logits.expand(rows, 4).contiguous(), [params] * rows, list(range(rows)))
    freq = torch.bincount(torch.tensor(tokens), minlength=4).double() / rows
    assert torch.allclose(freq, logits[0].double().softmax(-1), atol=0.03)


def test_seeds_reproduce_and_differ():
    logits = _logits(rows=1, vocab=1000)
    draw = lambda seed, off: Sampler().sample(  # noqa: E731
        logits, [SamplingParams(temperature=1.0, seed=seed)], [off])[0]
    assert [draw(11, i) for i in range(20)] == [draw(11, i) for i in range(20)]
    assert [draw(11, i) for i in range(20)] != [draw(12, i) for i in range(20)]
    assert mix_seed(1, 0) != mix_seed(0, 1) and 0 <= mix_seed(2**70, 5) < 2**63


def test_unseeded_requests_use_the_runner_generator():
    logits = _logits(rows=1, vocab=1000)
    p = [SamplingParams(temperature=1.0)]
    s1, s2 = Sampler(5), Sampler(5)
    first = [s1.sample(logits, p, [0])[0] for _ in range(10)]
    assert first == [s2.sample(logits, p, [0])[0] for _ in range(10)]
    assert len(set(first)) > 1  # the stream advances: same offset, new draws
