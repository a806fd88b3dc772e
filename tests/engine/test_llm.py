"""The offline API with the simulated runner (the torch path is tested with the model)."""

import subprocess
import sys

import pytest
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.llm import LLM
from kvfleet_engine.runners.cost_model import list_profiles, load_profile


def test_generate_keeps_prompt_order_and_accepts_text_or_ids():
    llm = LLM("cpu-tiny", runner="simulated", num_blocks=64, max_num_seqs=2)
    params = SamplingParams(max_tokens=4, temperature=0)
    outs = llm.generate(["first prompt", [104, 105], "third"], params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 4, 4]
    assert len(outs[0].prompt_token_ids) == len("first prompt")
    assert outs[1].prompt_token_ids == [104, 105]
    again = LLM("cpu-tiny", runner="simulated", num_blocks=64).generate([104, 105], params)
    assert again[0].outputs[0].token_ids == outs[1].outputs[0].token_ids  # deterministic


def test_per_prompt_params_and_mismatch_error():
    llm = LLM("h100-llama3-8b", runner="simulated", num_blocks=64)
    outs = llm.generate(["a", "b"], [SamplingParams(max_tokens=1), SamplingParams(max_tokens=3)])
    assert [len(o.outputs[0].token_ids) for o in outs] == [1, 3]
    with pytest.raises(ValueError, match="2 prompts but 1"):
        llm.generate(["a", "b"], [SamplingParams()])


@pytest.mark.parametrize("kwargs, message", [
    (dict(model="cpu-tiny", runner="gpu"), "runner must be one of"),
    (dict(model="no-such-profile", runner="simulated"), "unknown cost profile"),
    (dict(model="cpu-tiny", runner="simulated", max_num_seqz=3), "unknown engine option"),
    (dict(model="cpu-tiny", runner="simulated", block_size=0), "block_size"),
])
def test_bad_construction_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(**kwargs)


def test_shipped_profiles_load_and_cite_their_source():
    assert {"cpu-tiny", "h100-llama3-8b"} <= set(list_profiles())
    h100 = load_profile("h100-llama3-8b")
    assert "nvidia.com" in h100.source and h100.model["num_layers"] == 32


def test_core_imports_without_torch():
    code = (
        "import sys; import kvfleet_engine.llm, kvfleet_engine.core.engine;"
        "import kvfleet_engine.runners.sim_runner;"
        "from kvfleet_engine.llm import LLM; LLM('cpu-tiny', runner='simulated', num_blocks=32);"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_torch_runner_generates_the_reference_greedy_tokens():
    pytest.importorskip("torch")
    from kvfleet_engine.model.reference import reference_greedy

    llm = LLM("tiny-random", num_blocks=32, block_size=4, max_num_batched_tokens=8)
    prompts = ["Hello there", "A longer prompt that needs several chunks"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    model = llm.engine.runner.model
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.outputs[0].token_ids == reference_greedy(model, llm.tokenizer.encode(prompt), 4)
    assert llm.engine.stats().kv_usage == 0.0


def test_unknown_model_is_a_clear_error():
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="unknown model"):
        LLM("no-such-model")
