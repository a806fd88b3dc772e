"""Acceptance: the batched, paged engine equals the naive reference token for token.

32 prompts of mixed lengths (some sharing prefixes) on the tiny random model, through the
real LLMEngine + TorchRunner, under several scheduler configurations, once on the fused
CPU kernels and once on the plain torch ops.
"""

import random

import pytest
from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.model import ops
from kvfleet_engine.model.reference import reference_greedy
from kvfleet_engine.model.tiny import build_tiny_random
from kvfleet_engine.runners.torch_runner import TorchRunner

EOS = 257
NUM_PROMPTS = 32


def _prompts() -> list[tuple[list[int], int]]:
    rng = random.Random(1234)
    shared = [rng.randrange(256) for _ in range(24)]  # a system-prompt-like common prefix
    out = []
    for i in range(NUM_PROMPTS):
        body = [rng.randrange(256) for _ in range(rng.choice([1, 3, 7, 15, 33, 60, 90]))]
        prompt = shared + body if i % 3 == 0 else body
        out.append((prompt, rng.randint(2, 14)))
    return out


@pytest.fixture(scope="module")
def model():
    return build_tiny_random(seed=0)


@pytest.fixture(scope="module", params=["kernels", "torch"])
def ops_path(request):
    """Every case runs on the fused CPU kernels and on the plain torch fallback."""
    ops.use_kernels(request.param == "kernels")
    yield request.param
    ops.use_kernels(True)


@pytest.fixture(scope="module")
def cases(model, ops_path):
    return [(p, n, reference_greedy(model, p, n, [EOS])) for p, n in _prompts()]


def _run(model, cfg: EngineConfig, cases, params=None):
    engine = LLMEngine(cfg, TorchRunner(model, cfg.num_blocks, cfg.block_size),
                       eos_token_ids=[EOS])
    for i, (prompt, n, _) in enumerate(cases):
        engine.add_request(str(i), prompt, params(n) if params else
                           SamplingParams(max_tokens=n, temperature=0))
    done: dict[int, list[int]] = {}
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.is_finished:
                done[int(out.request_id)] = list(out.token_ids)
    assert len(done) == len(cases)
    return [done[i] for i in range(len(cases))], engine.stats()


CONFIGS = {
    "no-prefix-cache": dict(enable_prefix_caching=False),
    "prefix-cache": dict(enable_prefix_caching=True),
    "chunked-prefill-8": dict(enable_prefix_caching=True, max_num_batched_tokens=8),
    "chunked-prefill-5-no-cache": dict(enable_prefix_caching=False, max_num_batched_tokens=5),
    "preemption": dict(enable_prefix_caching=True, num_blocks=34, max_model_len=128,
                       kv_safety_margin=0.0, max_num_batched_tokens=64),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_engine_greedy_equals_reference(model, cases, name):
    base = dict(num_blocks=512, block_size=4, max_num_seqs=32, max_num_batched_tokens=256,
                max_model_len=256)
    outputs, stats = _run(model, EngineConfig(**{**base, **CONFIGS[name]}), cases)
    for i, (got, (_, _, ref)) in enumerate(zip(outputs, cases, strict=True)):
        assert got == ref, f"prompt {i}: engine {got} != reference {ref}"
    if name == "prefix-cache":
        assert stats.prefix_cache_hits > 0
    if name == "preemption":
        assert stats.num_preemptions > 0
    if name.startswith("no-prefix"):
        assert stats.prefix_cache_hits == 0


def test_seeded_sampling_survives_batching_and_preemption(model, cases):
    def params(n):
        return SamplingParams(max_tokens=n, temperature=0.9, top_p=0.95, top_k=40, seed=n * 7)

    roomy = EngineConfig(num_blocks=512, block_size=4, max_num_seqs=32, max_model_len=256,
                         max_num_batched_tokens=256)
    tight = EngineConfig(num_blocks=34, block_size=4, max_num_seqs=32, max_model_len=128,
                         max_num_batched_tokens=16, kv_safety_margin=0.0)
    a, _ = _run(model, roomy, cases, params)
    b, stats = _run(model, tight, cases, params)
    assert stats.num_preemptions > 0
    assert a == b
    greedy = [ref for _, _, ref in cases]
    assert a != greedy  # sampling really sampled
