import json

import pytest
from kvfleet_router.errors import RequestError
from kvfleet_router.request_info import parse_request


def parse(body, path="/v1/completions", headers=None):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(raw, path, headers or {}, "x-session-id", True)


def test_completion_fields():
    info = parse({"model": "m", "prompt": "hello", "stream": True, "max_tokens": 7,
                  "user": "u1", "priority": -2})
    assert (info.model, info.prompt_text, info.is_stream, info.max_tokens, info.session_key,
            info.priority) == ("m", "hello", True, 7, "u1", -2)
    assert info.estimated_prompt_tokens(1.0) == 5


def test_chat_messages_render_and_header_session_wins():
    info = parse({"messages": [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
                 path="/v1/chat/completions",
                 headers={"x-session-id": "s9", "x-kvfleet-priority": "3"})
    assert info.prompt_text == "system: be brief\nuser: hi\n"
    assert info.session_key == "s9" and info.priority == 3


def test_token_prompts():
    assert parse({"prompt": [1, 2, 3]}).prompt_token_ids == [1, 2, 3]
    assert parse({"prompt": [[4, 5], [6]]}).prompt_token_ids == [4, 5]
    assert parse({"prompt": ["a", "b"]}).prompt_text == "ab"


@pytest.mark.parametrize("body, path, param", [
    (b"{not json", "/v1/completions", None),
    (b"[1]", "/v1/completions", None),
    ({"model": 3, "prompt": "x"}, "/v1/completions", "model"),
    ({"model": "m"}, "/v1/completions", "prompt"),
    ({"prompt": {"a": 1}}, "/v1/completions", "prompt"),
    ({"prompt": [True, 2]}, "/v1/completions", "prompt"),
    ({"messages": []}, "/v1/chat/completions", "messages"),
    ({"messages": ["hi"]}, "/v1/chat/completions", "messages"),
    ({"prompt": "x", "priority": "high"}, "/v1/completions", "priority"),
])
def test_bad_bodies_are_400(body, path, param):
    with pytest.raises(RequestError) as err:
        parse(body, path)
    assert err.value.status == 400 and err.value.param == param
