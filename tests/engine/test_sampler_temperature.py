"""Temperature, top-k and top-p change what is sampled (each test fails if one is ignored)."""

import pytest
import torch
from kvfleet_engine import LLM, SamplingParams
from kvfleet_engine.model.sampler import Sampler, filtered_probs

PEAKED = torch.tensor([[3.0, 1.0, 0.0, -1.0, -2.0]])


def _probs_in_vocab_order(logits, temperature, top_k=0, top_p=1.0):
    n = logits.shape[0]
    probs, ids = filtered_probs(logits.double(), torch.full((n,), temperature, dtype=torch.float64),
                                torch.full((n,), top_k), torch.full((n,), top_p,
                                                                    dtype=torch.float64))
    return torch.zeros_like(probs).scatter(1, ids, probs)


def _draws(logits, params, num_draws):
    """`num_draws` seeded draws of one token (offsets 0..n-1), as frequencies per token."""
    vocab = logits.shape[-1]
    rows = logits.expand(num_draws, vocab).contiguous()
    tokens = Sampler(0).sample(rows, [params] * num_draws, list(range(num_draws)))
    return torch.bincount(torch.tensor(tokens), minlength=vocab).double() / num_draws


@pytest.mark.parametrize("temperature", [0.25, 0.5, 2.0, 4.0])
def test_probabilities_are_the_softmax_of_logits_over_temperature(temperature):
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)) * 2
    want = (logits.double() / temperature).softmax(-1)
    assert torch.allclose(_probs_in_vocab_order(logits, temperature), want, atol=1e-12)


def test_temperature_zero_is_exactly_the_argmax_inside_a_sampled_batch():
    logits = torch.randn(32, 500, generator=torch.Generator().manual_seed(2)) * 4
    params = [SamplingParams(temperature=0.0) if i % 2 else SamplingParams(temperature=1.5,
                                                                             seed=i)
              for i in range(32)]
    tokens = Sampler(0).sample(logits, params, [0] * 32)
    argmax = logits.argmax(-1).tolist()
    assert [t for i, t in enumerate(tokens) if i % 2] == argmax[1::2]
    assert [t for i, t in enumerate(tokens) if not i % 2] != argmax[0::2]  # others sample


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_empirical_distribution_follows_the_tempered_softmax(temperature):
    freq = _draws(PEAKED, SamplingParams(temperature=temperature, seed=7), 4000)
    assert torch.allclose(freq, (PEAKED[0].double() / temperature).softmax(-1), atol=0.03)


def test_high_temperature_spreads_a_peaked_distribution_low_temperature_sharpens_it():
    cold = _draws(PEAKED, SamplingParams(temperature=0.3, seed=7), 3000)
    warm = _draws(PEAKED, SamplingParams(temperature=1.0, seed=7), 3000)
    hot = _draws(PEAKED, SamplingParams(temperature=3.0, seed=7), 3000)
    assert cold[0] > 0.99 and 0.8 < warm[0] < 0.92 and hot[0] < 0.55
    assert (hot > 0).sum() == 5 and (cold > 0).sum() <= 2


def test_top_k_renormalises_the_tempered_softmax_over_the_k_best():
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(3)) * 2
    best = logits[0].topk(3).indices
    got = _probs_in_vocab_order(logits, 2.0, top_k=3)[0]
    assert set(got.nonzero().flatten().tolist()) == set(best.tolist())
    assert torch.allclose(got[best], (logits[0, best].double() / 2.0).softmax(-1), atol=1e-12)


def test_top_p_nucleus_is_taken_after_temperature():
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(4)) * 2
    kept = {t: int((_probs_in_vocab_order(logits, t, top_p=0.9) > 0).sum()) for t in (0.5, 3.0)}
    assert kept[0.5] < kept[3.0]


def test_the_engine_honours_temperature_end_to_end():
    """48 seeded one-token completions of one prompt on the torch runner: near-zero
    temperature always yields the greedy token; a high one spreads over many tokens."""
    llm = LLM("tiny-random", num_blocks=64, block_size=4, max_num_seqs=48)
    prompt = [10, 20, 30]
    greedy = llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0))[0]
    greedy = greedy.outputs[0].token_ids

    def first_tokens(temperature):
        params = [SamplingParams(max_tokens=1, temperature=temperature, seed=s, ignore_eos=True)
                  for s in range(48)]
        return [o.outputs[0].token_ids[0] for o in llm.generate([prompt] * 48, params)]

    assert set(first_tokens(0.01)) == set(greedy)
    assert len(set(first_tokens(5.0))) >= 10
