"""Quotas and API keys through the real router app (aiohttp, in process) in front of an
in-process OpenAI-shaped backend: 429 in OpenAI's shape (read back by the `openai`
client), x-ratelimit-* headers on answers and streams, tokens settled on usage, key ->
tenant, 401, and a key that appears in no log line, error body or metric."""

import json
import logging

import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kvfleet_router.api_keys import ApiKeys
from kvfleet_router.app import RouterApp
from kvfleet_router.config import RouterConfig
from router_fixtures import in_process_backend

KEY_A = "sk-test-aaaaaaaaaaaaaaaaaaaaaaaa"
KEY_B = "sk-test-bbbbbbbbbbbbbbbbbbbbbbbb"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _backend(seen: list[dict]) -> web.Application:
    """Answers 3 completion tokens; usage counts the prompt as 1 token per 4 chars."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append({"headers": dict(request.headers), "body": body})
        prompt = len(body.get("prompt", "")) // 4
        usage = {"prompt_tokens": prompt, "completion_tokens": 3,
                 "total_tokens": prompt + 3}
        if not body.get("stream"):
            return web.json_response({"id": "x", "object": "text_completion", "model": "m",
                                      "choices": [{"index": 0, "text": "a b c",
                                                   "finish_reason": "length"}],
                                      "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for tok in ("a", "b", "c"):
            chunk = {"id": "x", "object": "text_completion", "model": "m",
                     "choices": [{"index": 0, "text": tok, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            final = {"id": "x", "object": "text_completion", "model": "m", "choices": [],
                     "usage": usage}
            await resp.write(f"data: {json.dumps(final)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    return in_process_backend(completions)


@pytest.fixture
async def fleet(tmp_path):
    """start(quotas, keys=None) -> (router client, backend requests seen, clock, app)."""
    opened = []

    async def start(quotas, keys=None):
        seen: list[dict] = []
        backend = TestClient(TestServer(_backend(seen)))
        await backend.start_server()
        opened.append(backend)
        cfg = RouterConfig.from_dict({
            "endpoints": [{"name": "b0", "url": str(backend.make_url("")).rstrip("/")}],
            "quotas": quotas})
        api_keys = None
        if keys is not None:
            path = tmp_path / "api-keys.yaml"
            path.write_text("".join(f"{k}: {t}\n" for k, t in keys.items()))
            api_keys = ApiKeys(str(path))
        app = RouterApp(cfg, "admin-token", api_keys=api_keys)
        clock = FakeClock()
        app.gate.clock = clock
        router = TestClient(TestServer(app.build()))
        await router.start_server()
        opened.append(router)
        return router, seen, clock, app

    yield start
    for client in reversed(opened):
        await client.close()


async def _complete(router, headers=None, **body):
    resp = await router.post("/v1/completions", headers=headers or {},
                             json={"model": "m", "prompt": "x" * 40, "max_tokens": 10, **body})
    return resp, await resp.read()


async def test_over_its_rpm_a_tenant_gets_openais_429_and_headers_on_every_answer(fleet):
    router, _, clock, _ = await fleet({"tenants": {"a": {"rpm": 120}}, "burst_s": 1.0})
    hdr = {"x-kvfleet-tenant": "a"}
    first, _ = await _complete(router, hdr)
    second, _ = await _complete(router, hdr)
    assert first.status == second.status == 200
    assert first.headers["x-ratelimit-limit-requests"] == "120"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"  # a bucket of 2
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    assert second.headers["x-ratelimit-reset-requests"] == "1s"  # 2 requests at 2/s
    assert "x-ratelimit-limit-tokens" not in first.headers  # no TPM limit, no token headers
    third, raw = await _complete(router, hdr)
    assert third.status == 429
    err = json.loads(raw)["error"]
    assert err["type"] == "requests" and err["code"] == "rate_limit_exceeded"
    assert err["param"] is None
    assert err["message"].startswith("Rate limit reached for tenant 'a' on requests per min "
                                     "(RPM): Limit 120, Remaining 0, Requested 1.")
    assert third.headers["x-ratelimit-remaining-requests"] == "0"
    assert third.headers["x-ratelimit-reset-requests"] == "1s"
    assert third.headers["Retry-After"] == "1"
    other, _ = await _complete(router, {"x-kvfleet-tenant": "b"})  # unlimited: no headers
    assert other.status == 200 and "x-ratelimit-limit-requests" not in other.headers
    clock.now += 0.5  # one request refilled
    fourth, _ = await _complete(router, hdr)
    assert fourth.status == 200


async def test_the_openai_client_reads_the_429_as_a_rate_limit_error(fleet):
    router, _, _, _ = await fleet({"default": {"tpm": 600}, "burst_s": 6.0})  # 60 tokens
    client = openai.AsyncOpenAI(base_url=str(router.make_url("/v1")), api_key="unused",
                                max_retries=0)
    ok = await client.completions.with_raw_response.create(model="m", prompt="x" * 40,
                                                           max_tokens=10)
    assert ok.headers["x-ratelimit-limit-tokens"] == "600"
    assert ok.headers["x-ratelimit-remaining-tokens"] == "40"  # 10 prompt + 10 charged
    with pytest.raises(openai.RateLimitError) as exc:
        await client.completions.create(model="m", prompt="x" * 400, max_tokens=10)
    assert exc.value.code == "rate_limit_exceeded"
    assert exc.value.body["type"] == "tokens"
    await client.close()


async def test_tokens_are_charged_up_front_and_settled_on_the_answers_usage(fleet):
    router, _, _, _ = await fleet({"default": {"tpm": 6000}, "burst_s": 6.0})  # 600 tokens
    first, _ = await _complete(router, max_tokens=200)  # charged 10 + 200
    assert first.headers["x-ratelimit-remaining-tokens"] == "390"
    # usage was 10 + 3: the unused 197 came back before the next request
    second, _ = await _complete(router, max_tokens=200)
    assert second.headers["x-ratelimit-remaining-tokens"] == str(600 - 13 - 210)


async def test_a_stream_carries_the_headers_and_settles_on_its_usage_or_its_events(fleet):
    router, _, _, _ = await fleet({"default": {"tpm": 6000}, "burst_s": 6.0})
    resp, raw = await _complete(router, stream=True, max_tokens=100,
                                stream_options={"include_usage": True})
    assert resp.status == 200 and raw.endswith(b"data: [DONE]\n\n")
    assert resp.headers["x-ratelimit-remaining-tokens"] == "490"  # 600 - (10 + 100)
    resp, _ = await _complete(router, stream=True, max_tokens=100)  # no usage event
    assert resp.headers["x-ratelimit-remaining-tokens"] == str(600 - 13 - 110)
    resp, _ = await _complete(router, max_tokens=1)
    # the second stream was settled from its 3 content events + the 10-token prompt
    assert resp.headers["x-ratelimit-remaining-tokens"] == str(600 - 13 - 13 - 11)


async def test_a_request_without_max_tokens_is_charged_the_configured_default(fleet):
    router, _, _, _ = await fleet({"default": {"tpm": 60_000}, "default_max_tokens": 500})
    resp = await router.post("/v1/completions", json={"model": "m", "prompt": "x" * 40})
    assert resp.headers["x-ratelimit-remaining-tokens"] == str(2000 - 510)


async def test_api_keys_name_the_tenant_and_bad_or_missing_keys_get_401(fleet, caplog):
    router, seen, _, app = await fleet({"tenants": {"team-a": {"rpm": 60}}, "burst_s": 1.0},
                                       keys={KEY_A: "team-a", KEY_B: "team-b"})
    caplog.set_level(logging.DEBUG)
    ok, _ = await _complete(router, {"Authorization": f"Bearer {KEY_A}",
                                     "x-kvfleet-tenant": "team-b"})  # the header is ignored
    assert ok.status == 200 and ok.headers["x-ratelimit-limit-requests"] == "60"
    assert "authorization" not in {k.lower() for k in seen[-1]["headers"]}  # not forwarded
    limited, raw_limited = await _complete(router, {"Authorization": f"Bearer {KEY_A}"})
    assert limited.status == 429  # team-a's one request this second was spent
    b, _ = await _complete(router, {"Authorization": f"Bearer {KEY_B}",
                                    "x-kvfleet-tenant": "team-a"})
    assert b.status == 200 and "x-ratelimit-limit-requests" not in b.headers
    wrong_key = "sk-test-" + "c" * 24
    bad, raw_bad = await _complete(router, {"Authorization": f"Bearer {wrong_key}"})
    assert bad.status == 401
    assert json.loads(raw_bad)["error"] == {"message": "Incorrect API key provided.",
                                            "type": "invalid_request_error", "param": None,
                                            "code": "invalid_api_key"}
    missing, raw_missing = await _complete(router)
    assert missing.status == 401 and json.loads(raw_missing)["error"]["code"] is None
    assert len(seen) == 2  # neither 401 nor the 429 reached the backend
    metrics = await (await router.get("/metrics")).text()
    assert 'kvfleet_router_rejected_total{reason="invalid-api-key"} 1.0' in metrics
    everything = caplog.text + metrics + raw_bad.decode() + raw_missing.decode() + \
        raw_limited.decode()
    for key in (KEY_A, KEY_B, wrong_key):
        assert key not in everything
        assert key[8:20] not in everything  # nor a piece of it


async def test_the_key_file_is_read_again_when_it_changes(fleet, tmp_path):
    router, _, clock, app = await fleet({}, keys={KEY_A: "team-a"})
    (tmp_path / "api-keys.yaml").write_text(f"{KEY_B}: team-b\n")
    clock.now += 10  # past the reload check interval
    old, _ = await _complete(router, {"Authorization": f"Bearer {KEY_A}"})
    new, _ = await _complete(router, {"Authorization": f"Bearer {KEY_B}"})
    assert (old.status, new.status) == (401, 200)
    (tmp_path / "api-keys.yaml").write_text("{not yaml: [")  # broken: the keys in force stay
    clock.now += 10
    still, _ = await _complete(router, {"Authorization": f"Bearer {KEY_B}"})
    assert still.status == 200


async def test_a_config_push_changes_the_limits_in_force(fleet):
    router, _, clock, app = await fleet({"default": {"rpm": 60}, "burst_s": 1.0})
    first, _ = await _complete(router)
    assert first.status == 200
    cfg = app.core.cfg.to_dict() | {"version": 1, "quotas": {"default": {"rpm": 6000}}}
    resp = await router.put("/admin/config", json=cfg,
                            headers={"Authorization": "Bearer admin-token"})
    assert resp.status == 200
    clock.now += 0.01  # the bucket kept its level (empty); it now refills at 100/s
    again, _ = await _complete(router)
    assert again.status == 200 and again.headers["x-ratelimit-limit-requests"] == "6000"
