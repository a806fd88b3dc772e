"""The real `openai` client against a live `kvfleet engine` process (tiny-random, torch)."""

from __future__ import annotations

import json
import urllib.error
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


def _post_json(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _sse_bodies(url: str, path: str, body: dict) -> list[dict]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        lines = resp.read().decode().split("\n\n")
    return [json.loads(line[len("data: "):]) for line in lines
            if line.startswith("data: {")]


@pytest.mark.parametrize("is_chat", [False, True], ids=["completions", "chat"])
def test_return_token_ids_streams_the_ids_each_chunks_text_completes(tiny_engine, is_chat):
    """vLLM's `return_token_ids`: the prompt's ids on the first chunk (chat beside the
    choices, completions inside), and on every chunk the output ids whose text that
    chunk completes, so the ids sent so far always decode to the text sent so far (a
    router continuing a broken stream from them loses no text: byte-level tokens of a
    random model hold back partial UTF-8 often). Whole answers carry the same ids."""
    tok = ByteTokenizer()
    path = "/v1/chat/completions" if is_chat else "/v1/completions"
    prompt = {"messages": MESSAGES} if is_chat else {"prompt": PROMPT}
    body = {"model": "tiny-random", **prompt, "max_tokens": 40, "return_token_ids": True,
            **GREEDY, **EXACT}
    whole = _post_json(tiny_engine.url, path, body)
    chunks = _sse_bodies(tiny_engine.url, path, {**body, "stream": True})
    expected_prompt = tok.encode(tok.apply_chat_template(MESSAGES, True)) if is_chat \
        else tok.encode(PROMPT)
    first = chunks[0] if is_chat else chunks[0]["choices"][0]
    assert first["prompt_token_ids"] == expected_prompt
    assert all("prompt_token_ids" not in c and "prompt_token_ids" not in c["choices"][0]
               for c in chunks[1:])
    ids: list[int] = []
    text = ""
    for c in chunks:
        choice = c["choices"][0]
        ids += choice["token_ids"]
        text += (choice["delta"].get("content") or "") if is_chat else choice["text"]
        assert tok.decode(ids) == text
    assert len(ids) == 40
    whole_choice = whole["choices"][0]
    assert ids == whole_choice["token_ids"]
    assert (whole if is_chat else whole_choice)["prompt_token_ids"] == expected_prompt
    plain = _post_json(tiny_engine.url, path, {**body, "return_token_ids": False})
    assert "token_ids" not in plain["choices"][0]


def test_continue_final_message_extends_the_assistant_message(tiny_engine):
    """vLLM's `continue_final_message`: the conversation is rendered without the
    generation prompt and cut after the final assistant message, so the answer continues
    it: the same tokens as a completion of the rendered prompt plus that text."""
    tok = ByteTokenizer()
    partial = "Hello wor"
    chat = _post_json(tiny_engine.url, "/v1/chat/completions", {
        "model": "tiny-random", "max_tokens": 12, "add_generation_prompt": False,
        "continue_final_message": True, **GREEDY, **EXACT,
        "messages": [*MESSAGES, {"role": "assistant", "content": partial}]})
    completion = _post_json(tiny_engine.url, "/v1/completions", {
        "model": "tiny-random", "max_tokens": 12, **GREEDY, **EXACT,
        "prompt": tok.apply_chat_template(MESSAGES, True) + partial})
    assert chat["choices"][0]["message"]["content"] == completion["choices"][0]["text"]
    assert chat["usage"]["prompt_tokens"] == completion["usage"]["prompt_tokens"]


@pytest.mark.parametrize("messages, extra, needle", [
    ([*MESSAGES, {"role": "assistant", "content": "Hi"}], {"add_generation_prompt": True},
     "Cannot set both"),
    (MESSAGES, {}, "assistant message last"),
    ([*MESSAGES, {"role": "assistant", "content": ""}], {}, "assistant message last"),
])
def test_continue_final_message_refuses_what_it_cannot_continue(tiny_engine, messages, extra,
                                                                needle):
    req = urllib.request.Request(
        tiny_engine.url + "/v1/chat/completions",
        data=json.dumps({"model": "tiny-random", "messages": messages, "max_tokens": 2,
                         "continue_final_message": True, **extra}).encode(),
        headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 400
    assert needle in json.loads(err.value.read())["error"]["message"]
