"""migration.py's pure parts: what the client was sent, the continuation request, the splice."""

from __future__ import annotations

import json

from kvfleet_router.migration import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    Splice,
    StreamLedger,
    closing_events,
    continuation,
    is_migratable,
    parse_events,
    strip_token_ids,
)


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat_chunk(content: str | None, ids: list[int] | None = None, role: bool = False,
               finish: str | None = None, **top: object) -> dict:
    delta: dict = {"content": content} if content is not None else {}
    if role:
        delta["role"] = "assistant"
    choice: dict = {"index": 0, "delta": delta, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return {"id": "chatcmpl-1", "created": 7, "model": "m", "object": "chat.completion.chunk",
            "choices": [choice], **top}


def test_the_ledger_forwards_whole_events_only_and_keeps_what_was_sent():
    ledger = StreamLedger()
    event = sse({"id": "c", "choices": [{"index": 0, "text": "ab", "token_ids": [1, 2]}]})
    assert ledger.feed(event[:10]) == b""  # half an event waits
    assert ledger.feed(event[10:] + event[:5]) == event
    st = ledger.state()
    assert (st.text, st.token_ids, st.num_sent_tokens) == ("ab", [1, 2], 2)
    assert not st.has_ended


def test_the_ledger_folds_long_streams_and_loses_nothing():
    ledger = StreamLedger()
    for i in range(3000):  # about 200 KB: folded a few times on the way
        ledger.feed(sse({"id": "c", "choices": [{"index": 0, "text": "x", "token_ids": [i],
                                                 "pad": "p" * 40}]}))
    st = ledger.state()
    assert st.token_ids == list(range(3000)) and st.text == "x" * 3000


def test_text_without_ids_counts_events_and_continues_from_text():
    ledger = StreamLedger()
    ledger.feed(sse({"id": "c", "choices": [{"index": 0, "text": "Hello"}]})
                + sse({"id": "c", "choices": [{"index": 0, "text": " wor"}]}))
    st = ledger.state()
    assert not st.has_ids and st.num_sent_tokens == 2
    body = {"prompt": "Say:", "max_tokens": 10, "stream": True}
    plan = continuation(COMPLETIONS_PATH, body, st, ask_token_ids=True)
    assert plan is not None and plan.path == COMPLETIONS_PATH
    assert plan.body["prompt"] == "Say:Hello wor" and plan.body["max_tokens"] == 8
    assert plan.body["return_token_ids"] is True


def test_a_token_id_prompt_without_output_ids_cannot_continue():
    ledger = StreamLedger()
    ledger.feed(sse({"id": "c", "choices": [{"index": 0, "text": "Hi"}]}))
    assert continuation(COMPLETIONS_PATH, {"prompt": [1, 2], "stream": True},
                        ledger.state(), True) is None


def test_a_chat_with_ids_continues_as_a_completion_over_the_templated_ids():
    ledger = StreamLedger()
    ledger.feed(sse(chat_chunk("", [], role=True, prompt_token_ids=[5, 6, 7]))
                + sse(chat_chunk("Hel", [8, 9])))
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10,
            "stream": True, "temperature": 0, "tool_choice": "none",
            "kv_transfer_params": {"do_remote_prefill": True}}
    plan = continuation(CHAT_PATH, body, ledger.state(), True)
    assert plan is not None and plan.as_completion and plan.path == COMPLETIONS_PATH
    assert plan.body["prompt"] == [5, 6, 7, 8, 9]
    assert plan.body["max_tokens"] == 8 and "max_completion_tokens" not in plan.body
    assert "messages" not in plan.body and "tool_choice" not in plan.body
    assert "kv_transfer_params" not in plan.body  # the decode leg computes its own prompt
    assert plan.body["temperature"] == 0


def test_a_chat_without_ids_continues_its_assistant_message():
    ledger = StreamLedger()
    ledger.feed(sse(chat_chunk("", role=True)) + sse(chat_chunk("Hel")))
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    plan = continuation(CHAT_PATH, body, ledger.state(), False)
    assert plan is not None and plan.path == CHAT_PATH and not plan.as_completion
    assert plan.body["messages"][-1] == {"role": "assistant", "content": "Hel"}
    assert plan.body["continue_final_message"] is True
    assert plan.body["add_generation_prompt"] is False
    assert body["messages"] == [{"role": "user", "content": "hi"}]  # the client's untouched


def test_nothing_generated_yet_asks_again_unchanged():
    ledger = StreamLedger()
    ledger.feed(sse(chat_chunk("", role=True)))
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 5}
    plan = continuation(CHAT_PATH, body, ledger.state(), False)
    assert plan is not None and plan.body["messages"] == body["messages"]
    assert plan.body["max_tokens"] == 5


def test_the_splice_drops_the_second_role_header_and_keeps_the_clients_id():
    ledger = StreamLedger()
    ledger.feed(sse(chat_chunk("", role=True)) + sse(chat_chunk("Hel", [1])))
    splice = Splice(ledger.state(), is_chat=True, as_completion=False)
    out = splice.feed(sse({**chat_chunk("", role=True), "id": "chatcmpl-2"})
                      + sse({**chat_chunk("lo", [2]), "id": "chatcmpl-2"}) + b"data: [DONE]\n\n")
    events = parse_events(out)
    assert len(events) == 2 and events[-1] == "[DONE]"
    assert events[0]["id"] == "chatcmpl-1" and events[0]["choices"][0]["delta"] == \
        {"content": "lo"}


def test_the_splice_shows_a_completion_as_chat_and_counts_usage_once():
    ledger = StreamLedger()
    ledger.feed(sse(chat_chunk("", [], role=True, prompt_token_ids=[5, 6, 7]))
                + sse(chat_chunk("ab", [8, 9])))
    splice = Splice(ledger.state(), is_chat=True, as_completion=True)
    cont = [{"id": "cmpl-9", "object": "text_completion", "created": 9, "model": "m",
             "choices": [{"index": 0, "text": "c", "token_ids": [10],
                          "prompt_token_ids": [5, 6, 7, 8, 9], "finish_reason": "length"}]},
            {"id": "cmpl-9", "object": "text_completion", "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
                       "prompt_tokens_details": {"cached_tokens": 5}}}]
    events = parse_events(splice.feed(b"".join(sse(c) for c in cont)))
    first = events[0]
    assert first["object"] == "chat.completion.chunk" and first["id"] == "chatcmpl-1"
    assert first["choices"][0]["delta"] == {"content": "c"}
    assert first["choices"][0]["finish_reason"] == "length"
    assert "prompt_token_ids" not in first["choices"][0]
    assert events[1]["usage"]["prompt_tokens"] == 3
    assert events[1]["usage"]["completion_tokens"] == 3
    assert events[1]["usage"]["total_tokens"] == 6
    assert events[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 3


def test_a_stream_cut_after_its_finish_gets_usage_and_done():
    ledger = StreamLedger()
    ledger.feed(sse(chat_chunk("", [], role=True, prompt_token_ids=[5, 6]))
                + sse(chat_chunk("ab", [8, 9], finish="stop")))
    st = ledger.state()
    events = parse_events(closing_events(st, True, 10, include_usage=True))
    assert events[0]["usage"] == {"prompt_tokens": 2, "completion_tokens": 2,
                                  "total_tokens": 4}
    assert events[-1] == "[DONE]"


def test_max_tokens_reached_before_the_finish_chunk_closes_with_length():
    ledger = StreamLedger()
    ledger.feed(sse({"id": "c", "choices": [{"index": 0, "text": "ab", "token_ids": [1, 2]}]}))
    st = ledger.state()
    events = parse_events(closing_events(st, False, 0, include_usage=False))
    assert events[0]["choices"][0]["finish_reason"] == "length"
    assert events[-1] == "[DONE]"


def test_token_ids_are_stripped_but_never_inside_text():
    text = 'say ,"token_ids":[1,2] and {"prompt_token_ids":[3]}'
    event = sse({"id": "c", "prompt_token_ids": [1, 2], "choices": [
        {"token_ids": [4], "index": 0, "text": text, "token_ids_x": 1},
        {"index": 1, "text": "", "token_ids": None}]})
    stripped = parse_events(strip_token_ids(event))[0]
    assert "prompt_token_ids" not in stripped
    assert stripped["choices"][0] == {"index": 0, "text": text, "token_ids_x": 1}
    assert stripped["choices"][1] == {"index": 1, "text": ""}
    assert strip_token_ids(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"


def test_only_plain_single_choice_streams_migrate():
    base = {"prompt": "x", "stream": True}
    assert is_migratable(COMPLETIONS_PATH, base)
    assert not is_migratable(COMPLETIONS_PATH, {**base, "stream": False})
    assert not is_migratable(COMPLETIONS_PATH, {**base, "n": 2})
    assert not is_migratable(COMPLETIONS_PATH, {**base, "logprobs": 2})
    assert not is_migratable(COMPLETIONS_PATH, {**base, "prompt": ["a", "b"]})
    assert is_migratable(COMPLETIONS_PATH, {**base, "prompt": ["a"]})
    chat = {"messages": [], "stream": True}
    assert is_migratable(CHAT_PATH, {**chat, "response_format": {"type": "text"}})
    assert not is_migratable(CHAT_PATH, {**chat, "response_format": {"type": "json_object"}})
    assert not is_migratable(CHAT_PATH, {**chat, "tools": [{"type": "function"}]})
    assert not is_migratable("/v1/embeddings", base)
