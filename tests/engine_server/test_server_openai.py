"""The real `openai` client against a live `kvfleet engine` process (tiny-random, torch)."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest
from kvfleet_engine.model.tokenizer import ByteTokenizer

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
GREEDY = {"temperature": 0}
EXACT = {"ignore_eos": True}  # vLLM's field: no early EOS, so token counts are exact


@pytest.fixture(scope="module")
def client(tiny_engine) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_engine.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


def test_models_lists_the_served_name(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny-random"]


def test_completion_whole_has_exact_usage(client):
    out = client.completions.create(model="tiny-random", prompt=PROMPT, max_tokens=12,
                                    extra_body=EXACT, **GREEDY)
    assert out.object == "text_completion"
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == len(ByteTokenizer().encode(PROMPT))
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12


def test_completion_stream_matches_whole(client):
    whole = client.completions.create(model="tiny-random", prompt=PROMPT, max_tokens=12,
                                      extra_body=EXACT, **GREEDY)
    chunks = list(client.completions.create(
        model="tiny-random", prompt=PROMPT, max_tokens=12, stream=True,
        stream_options={"include_usage": True}, extra_body=EXACT, **GREEDY))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_token_id_prompt_equals_text_prompt(client):
    ids = ByteTokenizer().encode(PROMPT)
    by_ids = client.completions.create(model="tiny-random", prompt=ids, max_tokens=6, **GREEDY)
    by_text = client.completions.create(model="tiny-random", prompt=PROMPT, max_tokens=6, **GREEDY)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_chat_whole_and_stream_agree_with_template_token_count(client):
    tok = ByteTokenizer()
    num_prompt = len(tok.encode(tok.apply_chat_template(MESSAGES, True)))
    whole = client.chat.completions.create(model="tiny-random", messages=MESSAGES,
                                           max_tokens=10, extra_body=EXACT, **GREEDY)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == num_prompt
    assert whole.usage.completion_tokens == 10
    chunks = list(client.chat.completions.create(
        model="tiny-random", messages=MESSAGES, max_tokens=10, stream=True,
        stream_options={"include_usage": True}, extra_body=EXACT, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == num_prompt
    assert chunks[-1].usage.completion_tokens == 10


def test_chat_stream_without_usage_sends_no_usage(client):
    chunks = list(client.chat.completions.create(
        model="tiny-random", messages=MESSAGES, max_tokens=3, stream=True, **GREEDY))
    assert chunks and all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def _first_fresh_pair(text: str) -> int:
    """An index i >= 1 where text[i:i+2] first occurs (a usable stop string)."""
    for i in range(1, len(text) - 2):
        if text.find(text[i:i + 2]) == i:
            return i
    raise AssertionError(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("is_stream", [False, True])
def test_stop_string_cuts_text_and_finishes_with_stop(client, is_stream):
    base = client.completions.create(model="tiny-random", prompt=PROMPT, max_tokens=24,
                                     extra_body=EXACT, **GREEDY).choices[0].text
    i = _first_fresh_pair(base)
    stop = base[i:i + 2]
    kwargs = dict(model="tiny-random", prompt=PROMPT, max_tokens=24, stop=[stop],
                  extra_body=EXACT, **GREEDY)
    if is_stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        out = client.completions.create(**kwargs)
        text, reason = out.choices[0].text, out.choices[0].finish_reason
    assert text == base[:i]
    assert reason == "stop"


def test_seeded_sampling_is_reproducible(client):
    def sample(seed: int) -> str:
        out = client.completions.create(model="tiny-random", prompt=PROMPT, max_tokens=16,
                                        temperature=1.0, top_p=0.95, seed=seed, extra_body=EXACT)
        return out.choices[0].text

    first = sample(1234)
    assert sample(1234) == first
    assert any(sample(seed) != first for seed in (1, 2, 3)), "the seed has no effect"


def test_health_and_unknown_fields_are_ignored(tiny_engine, client):
    with urllib.request.urlopen(tiny_engine.url + "/health", timeout=5) as resp:
        assert resp.status == 200 and json.load(resp) == {"status": "ok"}
    with urllib.request.urlopen(tiny_engine.url + "/version", timeout=5) as resp:
        assert json.load(resp)["version"]
    out = client.completions.create(model="tiny-random", prompt="x", max_tokens=2,
                                    extra_body={"frobnicate": {"a": 1}, "logit_bias": {},
                                                "logprobs": None, "echo": False})
    assert out.usage.completion_tokens >= 1
