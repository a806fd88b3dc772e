"""Bad input: each case gets the exact status and OpenAI error type, and a good stream
running at the same time finishes unharmed."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

import openai
from engine_fixtures import TINY_MAX_BODY

MAX_BODY = TINY_MAX_BODY
MAX_LEN = 512
C, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
BAD = "invalid_request_error"
MISSING = "not_found_error"

# (id, method, path, body: dict | bytes | None, status, type, param or None to skip)
CASES: list[tuple[str, str, str, Any, int, str, str | None]] = [
    ("malformed-json", "POST", C, b"{not json", 400, BAD, None),
    ("body-not-object", "POST", C, b"[1, 2]", 400, BAD, None),
    ("body-not-utf8", "POST", C, b"\xff\xfe{", 400, BAD, None),
    ("model-wrong-type", "POST", C, {"model": 5, "prompt": "x"}, 400, BAD, "model"),
    ("model-unknown", "POST", C, {"model": "gpt-9", "prompt": "x"}, 404, MISSING, "model"),
    ("prompt-missing", "POST", C, {"model": "tiny-random"}, 400, BAD, "prompt"),
    ("prompt-wrong-type", "POST", C, {"prompt": {"a": 1}}, 400, BAD, "prompt"),
    ("prompt-empty", "POST", C, {"prompt": ""}, 400, BAD, "prompt"),
    ("prompt-batched", "POST", C, {"prompt": ["a", "b"]}, 400, BAD, "prompt"),
    ("prompt-token-out-of-vocab", "POST", C, {"prompt": [1, 99999]}, 400, BAD, "prompt"),
    ("prompt-longer-than-context", "POST", C, {"prompt": "x" * (MAX_LEN + 10)}, 400, BAD,
     "prompt"),
    ("prompt-plus-max-tokens-over-context", "POST", C,
     {"prompt": "x" * (MAX_LEN - 10), "max_tokens": 20}, 400, BAD, "max_tokens"),
    ("max-tokens-zero", "POST", C, {"prompt": "x", "max_tokens": 0}, 400, BAD, "max_tokens"),
    ("max-tokens-negative", "POST", C, {"prompt": "x", "max_tokens": -3}, 400, BAD,
     "max_tokens"),
    ("max-tokens-string", "POST", C, {"prompt": "x", "max_tokens": "5"}, 400, BAD,
     "max_tokens"),
    ("max-tokens-bool", "POST", C, {"prompt": "x", "max_tokens": True}, 400, BAD, "max_tokens"),
    ("max-tokens-above-context", "POST", C, {"prompt": "x", "max_tokens": 100000}, 400, BAD,
     "max_tokens"),
    ("temperature-negative", "POST", C, {"prompt": "x", "temperature": -1}, 400, BAD,
     "temperature"),
    ("temperature-string", "POST", C, {"prompt": "x", "temperature": "hot"}, 400, BAD,
     "temperature"),
    ("temperature-too-high", "POST", C, {"prompt": "x", "temperature": 3}, 400, BAD,
     "temperature"),
    ("top-p-zero", "POST", C, {"prompt": "x", "top_p": 0}, 400, BAD, "top_p"),
    ("top-p-above-one", "POST", C, {"prompt": "x", "top_p": 1.5}, 400, BAD, "top_p"),
    ("top-k-below-minus-one", "POST", C, {"prompt": "x", "top_k": -2}, 400, BAD, "top_k"),
    ("top-k-float", "POST", C, {"prompt": "x", "top_k": 1.5}, 400, BAD, "top_k"),
    ("n-two", "POST", C, {"prompt": "x", "n": 2}, 400, BAD, "n"),
    ("seed-string", "POST", C, {"prompt": "x", "seed": "abc"}, 400, BAD, "seed"),
    ("stop-int", "POST", C, {"prompt": "x", "stop": 7}, 400, BAD, "stop"),
    ("stop-list-with-int", "POST", C, {"prompt": "x", "stop": ["ok", 3]}, 400, BAD, "stop"),
    ("stop-empty-string", "POST", C, {"prompt": "x", "stop": [""]}, 400, BAD, "stop"),
    ("stream-string", "POST", C, {"prompt": "x", "stream": "yes"}, 400, BAD, "stream"),
    ("stream-options-without-stream", "POST", C,
     {"prompt": "x", "stream_options": {"include_usage": True}}, 400, BAD, "stream_options"),
    ("priority-string", "POST", C, {"prompt": "x", "priority": "high"}, 400, BAD, "priority"),
    ("user-int", "POST", C, {"prompt": "x", "user": 42}, 400, BAD, "user"),
    ("kv-transfer-params-string", "POST", C, {"prompt": "x", "kv_transfer_params": "no"}, 400,
     BAD, "kv_transfer_params"),
    ("remote-prefill-without-address", "POST", C,
     {"prompt": "x", "kv_transfer_params": {"do_remote_prefill": True}}, 400, BAD,
     "kv_transfer_params"),
    ("remote-decode-streaming", "POST", C,
     {"prompt": "x", "stream": True, "kv_transfer_params": {"do_remote_decode": True}}, 400, BAD,
     "kv_transfer_params"),
    ("logprobs-unsupported", "POST", C, {"prompt": "x", "logprobs": 2}, 400, BAD, "logprobs"),
    ("echo-unsupported", "POST", C, {"prompt": "x", "echo": True}, 400, BAD, "echo"),
    ("chat-tools-unsupported", "POST", CHAT, {"messages": USER, "tools": [{"type": "function"}]},
     400, BAD, "tools"),
    ("body-too-large", "POST", C, {"prompt": "x" * (MAX_BODY + 100)}, 413, BAD, None),
    ("chat-messages-missing", "POST", CHAT, {"model": "tiny-random"}, 400, BAD, "messages"),
    ("chat-messages-string", "POST", CHAT, {"messages": "hi"}, 400, BAD, "messages"),
    ("chat-messages-empty", "POST", CHAT, {"messages": []}, 400, BAD, "messages"),
    ("chat-role-missing", "POST", CHAT, {"messages": [{"content": "x"}]}, 400, BAD,
     "messages[0].role"),
    ("chat-role-unknown", "POST", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400,
     BAD, "messages[0].role"),
    ("chat-content-int", "POST", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, BAD,
     "messages[0].content"),
    ("chat-content-image-part", "POST", CHAT,
     {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, BAD,
     "messages[0].content"),
    ("chat-max-completion-tokens-zero", "POST", CHAT,
     {"messages": USER, "max_completion_tokens": 0}, 400, BAD, "max_completion_tokens"),
    ("chat-model-unknown", "POST", CHAT, {"model": "nope", "messages": USER}, 404, MISSING,
     "model"),
    ("get-on-post-route", "GET", C, None, 405, BAD, None),
    ("unknown-route", "POST", "/v1/nothing", {}, 404, MISSING, None),
    ("unknown-kv-handle", "GET", "/v1/kv_transfer/bogus", None, 404, MISSING, None),
    ("kv-events-bad-since", "GET", "/v1/kv_events?since=abc", None, 400, BAD, "since"),
]


def send(url: str, method: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_at_least_25_cases():
    assert len(CASES) >= 25
    assert len({c[0] for c in CASES}) == len(CASES)


def test_bad_requests_get_exact_errors_while_a_good_stream_finishes(tiny_engine):
    engine = tiny_engine
    client = openai.OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0,
                           timeout=120)
    first_chunk = threading.Event()
    result: dict[str, Any] = {}

    def good_stream() -> None:
        try:
            stream = client.completions.create(
                model="tiny-random", prompt="a good request", max_tokens=300, temperature=0,
                stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True})
            chunks = []
            for c in stream:
                chunks.append(c)
                first_chunk.set()
            result["chunks"] = chunks
        except Exception as exc:  # noqa: BLE001 - reported by the assertions below
            result["error"] = exc
            first_chunk.set()

    thread = threading.Thread(target=good_stream)
    thread.start()
    assert first_chunk.wait(60), "the good stream never started"
    failures = []
    for name, method, path, body, status, err_type, param in CASES:
        got_status, got = send(engine.url + path, method, body)
        error = got.get("error", {})
        shape_ok = set(error) == {"message", "type", "param", "code"} and error["message"]
        if (got_status, error.get("type")) != (status, err_type) or not shape_ok or (
            param is not None and error.get("param") != param
        ):
            failures.append(f"{name}: got {got_status} {got}")
    thread.join(120)
    assert not failures, "\n".join(failures)
    assert "error" not in result, result.get("error")
    chunks = result["chunks"]
    assert chunks[-1].usage.completion_tokens == 300
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # the server is still healthy and serving
    ok = client.completions.create(model="tiny-random", prompt="still fine", max_tokens=3)
    assert ok.usage.completion_tokens >= 1
