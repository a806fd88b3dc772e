"""The pieces under the hostile corpus, in process: the strict JSON loader, the upload
cap, the engine's request-caused 500 marker and its KV-events warning."""

from __future__ import annotations

import logging
import os

import pytest
from aiohttp.test_utils import TestClient, TestServer
from helpers.procs import ProcessGroup, kvfleet_argv
from hostile_fleet import ENGINE_ARGS, ENV
from kvfleet_engine.contract.http_limits import (
    MAX_JSON_DEPTH,
    MAX_NUMBER_DIGITS,
    REQUEST_CAUSED_CODE,
    JSONRejected,
    UploadSlots,
    strict_loads,
)
from kvfleet_engine.server.app import build_app
from kvfleet_engine.server.serve import warn_if_open_kv_events
from kvfleet_engine.server.state import ServerSettings, ServerState


def _nested(depth: int) -> list:
    return [] if depth == 1 else [_nested(depth - 1)]


@pytest.mark.parametrize("raw, value", [
    (b'{"a": [1, 2, {"b": null}]}', {"a": [1, 2, {"b": None}]}),
    (b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, _nested(MAX_JSON_DEPTH)),
    (b'{"p": "' + b"[" * 10000 + b'"}', {"p": "[" * 10000}),  # brackets in a string are text
    (b'{"p": "\\"[[[[\\\\"}', {"p": '"[[[[\\'}),  # escaped quotes do not end the string
    (b'{"p": "' + b"9" * 5000 + b'"}', {"p": "9" * 5000}),  # digits in a string are text
    (b'{"n": ' + b"9" * MAX_NUMBER_DIGITS + b"}", {"n": int("9" * MAX_NUMBER_DIGITS)}),
    (b'{"f": 1e308}', {"f": 1e308}),
    ('{"u": "h\u00e9"}'.encode(), {"u": "h\u00e9"}),
])
def test_strict_loads_accepts(raw, value):
    assert strict_loads(raw) == value


@pytest.mark.parametrize("raw, code", [
    (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "json_too_deep"),
    (b'{"a":' * 100 + b"1" + b"}" * 100, "json_too_deep"),
    (b"[" * 100000, "json_too_deep"),
    (b'{"n": ' + b"9" * (MAX_NUMBER_DIGITS + 1) + b"}", "number_too_long"),
    (b'{"n": 1e' + b"9" * 100 + b"}", "number_too_long"),
    (b'{"n": NaN}', "invalid_json"),
    (b'{"n": -Infinity}', "invalid_json"),
    (b"{", "invalid_json"),
    (b"\xff", "invalid_json"),
    (b"", "invalid_json"),
])
def test_strict_loads_refuses(raw, code):
    with pytest.raises(JSONRejected) as err:
        strict_loads(raw)
    assert err.value.code == code and isinstance(err.value, ValueError)


def test_upload_slots_cap_each_address_alone():
    slots = UploadSlots(2)
    assert slots.acquire("a") and slots.acquire("a") and not slots.acquire("a")
    assert slots.acquire("b")
    slots.release("a")
    assert slots.in_use("a") == 1 and slots.acquire("a")
    for _ in range(3):
        slots.release("a")
    assert slots.in_use("a") == 0  # never negative, and forgotten when idle
    with pytest.raises(ValueError):
        UploadSlots(0)


def _settings(host: str, token: str = "") -> ServerSettings:
    return ServerSettings(served_model_names=["m"], max_model_len=64, vocab_size=300, host=host,
                          internal_token=token)


@pytest.mark.parametrize("host, token, warns", [
    ("0.0.0.0", "", True), ("::", "", True), ("10.1.2.3", "", True), ("", "", True),
    ("127.0.0.1", "", False), ("127.0.0.2", "", False), ("localhost", "", False),
    ("::1", "", False), ("0.0.0.0", "s3cret", False),
])
def test_kv_events_warning_when_open_beyond_loopback(host, token, warns, caplog):
    with caplog.at_level(logging.WARNING, "kvfleet_engine.server.serve"):
        assert warn_if_open_kv_events(_settings(host, token)) is warns
    assert ("KVFLEET_ENGINE_TOKEN" in caplog.text) is warns


def test_an_engine_on_all_interfaces_without_token_warns_at_start_up(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KVFLEET_ENGINE_TOKEN"}
    with ProcessGroup(tmp_path) as procs:
        engine = procs.start(kvfleet_argv("engine", "--host", "0.0.0.0", "--port", "{port}",
                                          *ENGINE_ARGS), env={**env, **ENV})
        log = engine.log_text()
    assert "WARNING" in log and "without KVFLEET_ENGINE_TOKEN" in log, log


class _BrokenTokenizer:
    vocab_size = 300

    def encode(self, text: str) -> list[int]:
        raise RuntimeError("a tokenizer bug this prompt triggers")


async def test_an_unexpected_error_in_the_request_stage_is_marked_request_caused(caplog):
    state = ServerState(_settings("127.0.0.1"), _BrokenTokenizer())
    async with TestClient(TestServer(build_app(state))) as client:
        with caplog.at_level(logging.DEBUG):
            resp = await client.post("/v1/completions", json={"prompt": "hi"})
            body = await resp.json()
    assert resp.status == 500
    assert body["error"]["code"] == REQUEST_CAUSED_CODE
    assert body["error"]["type"] == "server_error"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(r.levelno == logging.WARNING and "RuntimeError" in r.getMessage()
               for r in caplog.records)
