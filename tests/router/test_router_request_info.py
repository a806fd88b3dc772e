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


BODY = {"model": "m", "prompt": "hi"}


def test_slo_headers_become_seconds_and_are_optional():
    info = parse(BODY, headers={"x-kvfleet-slo-ttft-ms": "250", "x-kvfleet-slo-tpot-ms": "40.5"})
    assert (info.slo_ttft_s, info.slo_tpot_s) == (0.25, 0.0405)
    assert (parse(BODY).slo_ttft_s, parse(BODY).slo_tpot_s) == (None, None)


@pytest.mark.parametrize("value,is_ok", [
    ("0", False), ("1e-9", True), ("-5", False), ("3600000", True), ("3600000.5", False),
    ("nan", False), ("inf", False), ("fast", False), ("", False),
])
def test_slo_header_range_at_its_bounds(value, is_ok):
    headers = {"x-kvfleet-slo-ttft-ms": value}
    if is_ok:
        assert parse(BODY, headers=headers).slo_ttft_s == float(value) / 1000
    else:
        with pytest.raises(RequestError) as err:
            parse(BODY, headers=headers)
        assert err.value.param == "x-kvfleet-slo-ttft-ms"
        assert "(0, 3600000]" in str(err.value)


def test_a_requests_slo_reaches_the_routing_context():
    from kvfleet_router.config import RouterConfig
    from kvfleet_router.router_core import RouterCore

    cfg = RouterConfig.from_dict({"endpoints": [{"name": "a", "url": "http://127.0.0.1:1"}],
                                  "policy": {"name": "slo"}})
    core = RouterCore(cfg)
    info = parse(BODY, headers={"x-kvfleet-slo-ttft-ms": "300", "x-kvfleet-slo-tpot-ms": "20"})
    routed = core.route(info, "unified", now=0.0)
    assert (routed.ctx.slo_ttft_s, routed.ctx.slo_tpot_s) == (0.3, 0.02)
    assert routed.decision.endpoint is not None and routed.decision.endpoint.name == "a"
