"""Greedy parity: kvfleet's engine and vLLM on the same SmolLM2-135M weights (the HF folder
both load), same token-id prompts, temperature 0, EOS ignored. fp32 is expected to agree
token for token; bf16 kernels may drift after some tokens, so bf16 is measured, not
asserted. Figures go to bench/.cache/test-vllm-figures.json."""

from __future__ import annotations

import json
import random
import subprocess

import pytest
from vllm_helpers import FIGURES_PATH, HERE, smollm2_folder, vllm_env, vllm_python

MAX_TOKENS = 32
NUM_PROMPTS = 8


def _prompts() -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(200, 40000) for _ in range(rng.randrange(16, 200))]
            for _ in range(NUM_PROMPTS)]


def _vllm(folder, dtype: str, prompts) -> list[list[int]]:
    out = subprocess.run([str(vllm_python()), str(HERE / "vllm_greedy.py"), str(folder), dtype,
                          str(MAX_TOKENS)], input=json.dumps(prompts), capture_output=True,
                         text=True, timeout=480, env=vllm_env(), check=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def _kvfleet(folder, dtype: str, prompts) -> list[list[int]]:
    from kvfleet_engine import LLM, SamplingParams

    llm = LLM(str(folder), dtype=dtype, block_size=32, max_model_len=1024)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]


def _first_divergence(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_parity_with_vllm(dtype):
    folder, prompts = smollm2_folder(), _prompts()
    theirs = _vllm(folder, dtype, prompts)
    ours = _kvfleet(folder, dtype, prompts)
    diverge = [_first_divergence(a, b) for a, b in zip(ours, theirs, strict=True)]
    figures = json.loads(FIGURES_PATH.read_text()) if FIGURES_PATH.exists() else {}
    figures[f"parity_{dtype}"] = {
        "prompts": NUM_PROMPTS, "tokens_each": MAX_TOKENS,
        "identical": sum(d == MAX_TOKENS for d in diverge), "first_divergence": diverge}
    FIGURES_PATH.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    if dtype == "float32":
        assert diverge == [MAX_TOKENS] * NUM_PROMPTS, diverge
