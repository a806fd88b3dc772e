"""The offline API as a vLLM user writes it: vLLM's quick-start runs unchanged but for the
import and the model, results are shaped like vLLM's RequestOutput, and SamplingParams takes
vLLM's fields or refuses them by name. The simulated runner (no torch) serves most tests."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kvfleet_engine import LLM, CompletionOutput, RequestOutput, SamplingParams

# https://docs.vllm.ai/en/latest/getting_started/quickstart.html (offline batched inference)
VLLM_QUICKSTART = '''\
from vllm import LLM, SamplingParams
prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)
llm = LLM(model="facebook/opt-125m")
outputs = llm.generate(prompts, sampling_params)
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")
'''
QUICKSTART_PROMPTS = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]


def _sim(**kwargs) -> LLM:
    return LLM("cpu-tiny", runner="simulated", num_blocks=64, **kwargs)


def test_vllm_quickstart_runs_verbatim(tmp_path):
    pytest.importorskip("torch")
    script = VLLM_QUICKSTART.replace("from vllm import", "from kvfleet_engine import")
    script = script.replace('"facebook/opt-125m"', '"tiny-random"')
    changed = [a for a, b in zip(VLLM_QUICKSTART.splitlines(), script.splitlines(),
                                 strict=True) if a != b]
    assert len(changed) == 2  # the import line and the model name, nothing else
    (tmp_path / "quickstart.py").write_text(script)
    run = subprocess.run([sys.executable, "quickstart.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    lines = [x for x in run.stdout.splitlines() if x.startswith("Prompt: ")]
    assert len(lines) == 4
    for line, prompt in zip(lines, QUICKSTART_PROMPTS, strict=True):
        assert line.startswith(f"Prompt: {prompt!r}, Generated text: '") or line.startswith(
            f'Prompt: {prompt!r}, Generated text: "')


def test_outputs_are_shaped_like_vllms():
    llm = _sim()
    outs = llm.generate(["hello", "world"], SamplingParams(temperature=0, max_tokens=5))
    assert isinstance(outs, list) and [type(o) for o in outs] == [RequestOutput] * 2
    first = outs[0]
    assert first.request_id == "0" and outs[1].request_id == "1"
    assert first.prompt == "hello" and first.prompt_token_ids == list(b"hello")
    assert first.finished is True and first.prompt_logprobs is None
    [sample] = first.outputs
    assert isinstance(sample, CompletionOutput)
    assert sample.index == 0 and len(sample.token_ids) == 5 and sample.finish_reason == "length"
    assert sample.text == llm.get_tokenizer().decode(sample.token_ids)
    assert sample.cumulative_logprob is None and sample.logprobs is None
    assert sample.stop_reason is None and sample.finished()
    again = llm.generate("hello", SamplingParams(temperature=0, max_tokens=5))
    assert again[0].request_id == "2" and again[0].outputs[0].token_ids == sample.token_ids


def test_default_sampling_params_are_vllms():
    params = SamplingParams()
    assert (params.max_tokens, params.n, params.temperature, params.top_p) == (16, 1, 1.0, 1.0)
    outs = _sim().generate("hi")
    assert len(outs[0].outputs[0].token_ids) == 16  # max_tokens 16 (no EOS in the simulator)


def test_generate_takes_one_prompt_or_a_list_in_every_form():
    llm = _sim()
    params = SamplingParams(temperature=0, max_tokens=3)
    [text] = llm.generate("ab", params)
    [ids] = llm.generate([97, 98], params)
    [text_dict] = llm.generate({"prompt": "ab"}, params)
    [ids_dict] = llm.generate({"prompt_token_ids": [97, 98]}, params)
    many = llm.generate(["ab", [97, 98], {"prompt": "ab"}, {"prompt_token_ids": [97, 98]}],
                        params)
    assert [o.prompt for o in (text, ids, text_dict, ids_dict)] == ["ab", None, "ab", None]
    assert [o.prompt for o in many] == ["ab", None, "ab", None]
    tokens = text.outputs[0].token_ids
    for out in (ids, text_dict, ids_dict, *many):
        assert out.prompt_token_ids == [97, 98] and out.outputs[0].token_ids == tokens
    assert llm.generate([[97], [98, 99]], params)[1].prompt_token_ids == [98, 99]
    assert llm.generate([], params) == []


def test_one_sampling_params_per_prompt_and_mismatches():
    llm = _sim()
    outs = llm.generate(["a", "b"], [SamplingParams(max_tokens=1), SamplingParams(max_tokens=3)])
    assert [len(o.outputs[0].token_ids) for o in outs] == [1, 3]
    with pytest.raises(ValueError, match="2 prompts but 1 sampling params"):
        llm.generate(["a", "b"], [SamplingParams()])
    with pytest.raises(ValueError, match="2 prompts but 3 priorities"):
        llm.generate(["a", "b"], priority=[0, 1, 2])
    with pytest.raises(ValueError, match="must be SamplingParams, not dict"):
        llm.generate(["a"], [{"max_tokens": 3}])
    with pytest.raises(ValueError, match=r"prompt keys \['multi_modal_data'\]"):
        llm.generate({"prompt": "a", "multi_modal_data": {}})


def test_a_refused_batch_leaves_nothing_behind():
    llm = LLM("cpu-tiny", runner="simulated", num_blocks=64, max_model_len=64)
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        llm.generate(["fine", "x" * 60], SamplingParams(max_tokens=8))
    assert not llm.engine.has_unfinished_requests()
    [out] = llm.generate("fine", SamplingParams(max_tokens=2))
    assert len(out.outputs[0].token_ids) == 2


def test_n_samples_are_n_outputs_with_vllms_seeds():
    llm = _sim()
    [out] = llm.generate("hi", SamplingParams(n=3, seed=7, max_tokens=6))
    assert [s.index for s in out.outputs] == [0, 1, 2] and out.request_id == "0"
    alone = [llm.generate("hi", SamplingParams(seed=7 + i, max_tokens=6))[0].outputs[0]
             for i in range(3)]
    assert [s.token_ids for s in out.outputs] == [s.token_ids for s in alone]
    assert len({tuple(s.token_ids) for s in out.outputs}) == 3
    assert not llm.engine.has_unfinished_requests()


def test_n_unseeded_samples_are_independent_on_the_torch_runner():
    pytest.importorskip("torch")
    llm = LLM("tiny-random", dtype="auto", seed=0, num_blocks=64, block_size=4)  # vLLM's dtype
    [out] = llm.generate([10, 20, 30], SamplingParams(n=4, max_tokens=8, ignore_eos=True))
    assert len(out.outputs) == 4 and len({tuple(s.token_ids) for s in out.outputs}) > 1


def test_chat_returns_a_list_for_one_conversation_or_many():
    llm = _sim()
    hi = [{"role": "user", "content": "hi"}]
    bye = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "bye"}]
    one = llm.chat(hi, SamplingParams(max_tokens=2))
    assert isinstance(one, list) and len(one) == 1 and len(one[0].outputs[0].token_ids) == 2
    assert one[0].prompt == llm.tokenizer.apply_chat_template(hi, add_generation_prompt=True)
    two = llm.chat([hi, bye], [SamplingParams(max_tokens=1), SamplingParams(max_tokens=3)])
    assert [len(o.outputs[0].token_ids) for o in two] == [1, 3]
    assert "bye" in two[1].prompt and "be brief" in two[1].prompt
    with pytest.raises(ValueError, match="messages is empty"):
        llm.chat([])


def test_stop_reason_names_the_stop_string_or_token():
    llm = _sim()
    greedy = SamplingParams(temperature=0, max_tokens=32)
    tokens = llm.generate("hi", greedy)[0].outputs[0].token_ids
    k = next(i for i, t in enumerate(tokens) if 32 < t < 127)  # first printable ASCII token
    by_string = llm.generate("hi", SamplingParams(temperature=0, max_tokens=32,
                                                  stop=["never there", chr(tokens[k])]))
    sample = by_string[0].outputs[0]
    assert sample.finish_reason == "stop" and sample.stop_reason == chr(tokens[k])
    assert chr(tokens[k]) not in sample.text
    by_token = llm.generate("hi", SamplingParams(temperature=0, max_tokens=32,
                                                 stop_token_ids=[tokens[2]]))[0].outputs[0]
    assert by_token.finish_reason == "stop" and by_token.stop_reason == tokens[2]
    assert by_token.token_ids == tokens[:3]


def test_detokenize_false_hands_out_token_ids_only():
    [out] = _sim().generate("hi", SamplingParams(max_tokens=4, detokenize=False))
    assert out.outputs[0].text == "" and len(out.outputs[0].token_ids) == 4


# --- SamplingParams: vLLM's fields, taken or refused by name ---


def test_sampling_params_take_vllms_common_fields():
    params = SamplingParams(n=2, temperature=0.8, top_p=0.95, top_k=-1, max_tokens=32,
                            stop="\n", seed=3, logprobs=None, presence_penalty=0.0,
                            frequency_penalty=0.0, repetition_penalty=1.0, min_p=0.0,
                            best_of=2, stop_token_ids=None, skip_special_tokens=True)
    assert params.stop == ["\n"] and params.stop_token_ids == [] and params.n == 2


@pytest.mark.parametrize("kwargs, message", [
    (dict(top_p=0), r"top_p must be in \(0, 1\], got 0"),
    (dict(top_p=1.0000001), "top_p must be in"),
    (dict(temperature=-1e-9), "temperature must be >= 0"),
    (dict(top_k=-2), "top_k must be -1 or 0"),
    (dict(max_tokens=0), "max_tokens must be an integer >= 1, got 0"),
    (dict(max_tokens=None), "max_tokens must be an integer >= 1, got None"),
    (dict(n=0), "n must be an integer >= 1, got 0"),
    (dict(n=2, best_of=3), "best_of=3 is not supported"),
    (dict(logprobs=1), "logprobs=1 is not supported: the engine does not compute log-prob"),
    (dict(prompt_logprobs=0), "prompt_logprobs=0 is not supported"),
    (dict(presence_penalty=0.5), "presence_penalty=0.5 is not supported: penalties"),
    (dict(repetition_penalty=1.1), "repetition_penalty=1.1 is not supported"),
    (dict(min_p=0.05), "min_p=0.05 is not supported"),
    (dict(min_tokens=4), "min_tokens=4 is not supported"),
    (dict(include_stop_str_in_output=True), "include_stop_str_in_output=True is not supp"),
    (dict(logit_bias={5: 1.0}), "logit_bias=.* is not supported"),
    (dict(stop=["x"], detokenize=False), "stop strings need detokenize=True"),
])
def test_sampling_params_refuse_what_the_engine_does_not_do(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(top_p=1e-9), dict(top_p=1), dict(temperature=0), dict(top_k=-1), dict(top_k=0),
    dict(top_k=1), dict(max_tokens=1), dict(n=1, best_of=1), dict(logprobs=None),
])
def test_sampling_params_accept_the_edges_of_their_ranges(kwargs):
    SamplingParams(**kwargs)


def test_sampling_params_refuse_an_unknown_field_by_name():
    with pytest.raises(TypeError, match="tempreature"):
        SamplingParams(tempreature=0.5)


def test_default_sampling_params_take_the_one_comparison_fast_path():
    from kvfleet_engine.core import sampling_params as sp

    assert sp._unsupported_values(SamplingParams()) == sp._DEFAULTS
    SamplingParams(logit_bias={}, bad_words=[])  # neutral, though not the defaults
