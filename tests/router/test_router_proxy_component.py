"""The router as a real process in front of fake OpenAI backends (real processes too)."""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.request

import openai
import pytest
from engine_fleet import metric_sum
from helpers.procs import free_port
from router_fixtures import endpoints_cfg, http_json, start_fake, start_router


def raw_post(url: str, body: dict, headers: dict | None = None, timeout_s: float = 30,
             ) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def fake_log(backend) -> list[dict]:
    return http_json(backend.url + "/_fake/log")[1]["log"]


def control(backend, **values) -> None:
    assert http_json(backend.url + "/_fake/control", values)[0] == 200


def client(router) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0,
                         timeout=30)


def test_stream_and_non_stream_bytes_pass_through_unchanged(procs, tmp_path):
    backends = [start_fake(procs, f"b{i}") for i in range(2)]
    router = start_router(procs, tmp_path, {"endpoints": endpoints_cfg(backends)})
    for i, stream in enumerate([False, True, False, True]):
        tag = f"t{i}"
        status, headers, body = raw_post(router.url + "/v1/completions",
                                         {"model": "fake", "prompt": f"p{i}", "max_tokens": 3,
                                          "stream": stream}, {"X-Test-Id": tag})
        assert status == 200
        assert headers["Content-Type"].startswith(
            "text/event-stream" if stream else "application/json")
        sent = [e["sent"] for b in backends for e in fake_log(b)
                if e["headers"].get("X-Test-Id") == tag]
        assert sent == [body.hex()]  # exactly one backend saw it, and the client got its bytes
    # the real openai client, both modes, chat and completions
    c = client(router)
    done = c.completions.create(model="fake", prompt="hello", max_tokens=4)
    assert done.choices[0].text.count(":") == 4 and done.usage.completion_tokens == 4
    chunks = list(c.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True))
    assert len(chunks) == 5


def test_retry_before_first_byte_and_upstream_error(procs, tmp_path):
    backends = [start_fake(procs, f"b{i}") for i in range(2)]
    router = start_router(procs, tmp_path, {"endpoints": endpoints_cfg(backends),
                                            "policy": {"name": "round-robin"}})
    control(backends[0], num_bad=1, status=500)
    control(backends[1], num_bad=1, status=503)
    # first request: one backend fails with 5xx, the retry lands on the other one... which
    # also fails once: the client sees the last upstream status as an OpenAI error
    status, _, body = raw_post(router.url + "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 503 and json.loads(body)["error"]["code"] == "upstream_error"
    control(backends[0], num_bad=1, status=500)
    results = [raw_post(router.url + "/v1/completions", {"prompt": "x", "max_tokens": 1,
                                                         "stream": s})[0] for s in (True, False)]
    assert results == [200, 200]
    metrics = urllib.request.urlopen(router.url + "/metrics").read().decode()
    assert "kvfleet_router_retries_total 2.0" in metrics
    assert 'kvfleet_router_backend_errors_total{endpoint="b0",kind="status"}' in metrics


def test_dead_endpoint_gets_nothing_and_nothing_is_lost(procs, tmp_path):
    live = start_fake(procs, "live")
    dead_url = f"http://127.0.0.1:{free_port()}"
    router = start_router(procs, tmp_path, {
        "endpoints": [{"name": "dead", "url": dead_url}, {"name": "live", "url": live.url}],
        "policy": {"name": "round-robin"}})
    for i in range(6):
        status, _, _ = raw_post(router.url + "/v1/completions", {"prompt": f"{i}",
                                                                 "max_tokens": 1})
        assert status == 200
    assert len(fake_log(live)) == 6


def test_failing_endpoint_is_ejected_passively(procs, tmp_path):
    flaky, good = start_fake(procs, "flaky"), start_fake(procs, "good")
    router = start_router(procs, tmp_path, {
        "endpoints": endpoints_cfg([flaky, good]), "policy": {"name": "round-robin"},
        "health": {"eject_after_errors": 2, "eject_base_s": 30, "eject_max_s": 30}})
    control(flaky, num_bad=100, status=500)  # /health stays 200: only traffic shows it
    for i in range(8):
        assert raw_post(router.url + "/v1/completions", {"prompt": f"{i}"})[0] == 200
    assert len(fake_log(flaky)) == 2 and len(fake_log(good)) == 8
    metrics = urllib.request.urlopen(router.url + "/metrics").read().decode()
    assert 'kvfleet_router_ejections_total{endpoint="b0"} 1.0' in metrics


def test_backend_dying_mid_stream_ends_with_an_error_event(procs, tmp_path):
    backend = start_fake(procs, "b0", "--token-delay-ms", "200")
    router = start_router(procs, tmp_path, {"endpoints": endpoints_cfg([backend])})
    stream = client(router).completions.create(model="fake", prompt="x", max_tokens=50,
                                               stream=True)
    first = next(iter(stream))
    assert first.choices[0].text == "b0:0 "
    backend.kill()
    t0 = time.monotonic()
    with pytest.raises(openai.APIError, match="mid-stream"):
        for _ in stream:
            pass
    assert time.monotonic() - t0 < 10  # ended promptly, never a hang


def wait_for_gauge(router, name: str, value: float, timeout_s: float = 10) -> None:
    """Wait until the router's own metric (summed over labels) reaches `value`."""
    deadline = time.monotonic() + timeout_s
    while metric_sum(router.url, name) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        time.sleep(0.02)


def test_saturation_queues_by_priority_then_429(procs, tmp_path):
    backend = start_fake(procs, "b0", "--token-delay-ms", "100")
    router = start_router(procs, tmp_path, {
        "endpoints": [{"name": "b0", "url": backend.url, "capacity": 1}],
        "queue": {"max_size": 2, "timeout_s": 10, "retry_after_s": 3}})
    url = router.url + "/v1/completions"

    def send(tag: str, priority: int, max_tokens: int = 5) -> int:
        return raw_post(url, {"prompt": tag, "max_tokens": max_tokens, "priority": priority,
                              "stream": True})[0]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        busy = pool.submit(send, "busy", 0, 20)
        wait_for_gauge(router, "kvfleet_router_in_flight", 1.0)
        low = pool.submit(send, "low", 5)
        wait_for_gauge(router, "kvfleet_router_queue_length", 1.0)
        high = pool.submit(send, "high", -1)
        wait_for_gauge(router, "kvfleet_router_queue_length", 2.0)
        status, headers, body = raw_post(url, {"prompt": "extra", "max_tokens": 1})
        assert status == 429 and headers["Retry-After"] == "3"
        assert json.loads(body)["error"]["type"] == "rate_limit_error"
        assert [f.result() for f in (busy, low, high)] == [200, 200, 200]
    order = [e["body"]["prompt"] for e in fake_log(backend)]
    assert order == ["busy", "high", "low"]


def test_queue_timeout_gives_429(procs, tmp_path):
    backend = start_fake(procs, "b0", "--token-delay-ms", "200")
    router = start_router(procs, tmp_path, {
        "endpoints": [{"name": "b0", "url": backend.url, "capacity": 1}],
        "queue": {"max_size": 4, "timeout_s": 0.3}})
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        busy = pool.submit(raw_post, router.url + "/v1/completions",
                           {"prompt": "busy", "max_tokens": 10})
        wait_for_gauge(router, "kvfleet_router_in_flight", 1.0)
        t0 = time.monotonic()
        status, headers, _ = raw_post(router.url + "/v1/completions", {"prompt": "late"})
        assert status == 429 and "Retry-After" in headers
        assert time.monotonic() - t0 < 1.5
        assert busy.result()[0] == 200


def test_bad_requests_get_openai_errors(procs, tmp_path):
    backend = start_fake(procs, "b0")
    router = start_router(procs, tmp_path, {
        "endpoints": [{"name": "b0", "url": backend.url, "models": ["fake"]}],
        "limits": {"max_body_bytes": 1000},
        "policy": {"allow_override": True}})
    url = router.url + "/v1/completions"
    cases = [
        ({"prompt": "x" * 2000}, {}, 413, None),
        ({"prompt": 5}, {}, 400, "prompt"),
        ({"model": "gpt-9", "prompt": "x"}, {}, 404, "model"),
        ({"prompt": "x"}, {"x-kvfleet-policy": "fastest"}, 400, "x-kvfleet-policy"),
    ]
    for body, headers, status, param in cases:
        got, _, raw = raw_post(url, body, headers)
        err = json.loads(raw)["error"]
        assert got == status and err["param"] == param and err["message"], (body, err)
    req = urllib.request.Request(url, data=b"{nope", method="POST")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req)
    assert exc.value.code == 400 and "not valid JSON" in json.loads(exc.value.read())[
        "error"]["message"]
    # the override header is honoured when allowed; the server still serves good requests
    assert raw_post(url, {"prompt": "x", "model": "fake"}, {"x-kvfleet-policy": "random"})[0] == 200
    metrics = urllib.request.urlopen(router.url + "/metrics").read().decode()
    assert 'kvfleet_router_requests_total{endpoint="b0",policy="random"} 1.0' in metrics


def test_signals_and_health_steer_traffic(procs, tmp_path):
    backends = [start_fake(procs, f"b{i}") for i in range(3)]
    router = start_router(procs, tmp_path, {
        "endpoints": endpoints_cfg(backends), "policy": {"name": "round-robin"},
        "signals": {"poll_interval_s": 0.2, "stale_after_s": 1.0},
        "health": {"probe_interval_s": 0.2}})
    control(backends[0], kv=0.99, legacy=True)  # saturated KV, reported under the old name
    control(backends[1], healthy=False)
    time.sleep(1.0)
    for i in range(6):
        assert raw_post(router.url + "/v1/completions", {"prompt": f"{i}"})[0] == 200
    assert [len(fake_log(b)) for b in backends] == [0, 0, 6]


def pd_fleet(procs, tmp_path, **cfg):
    """A prefill and a decode fake behind a router that runs a prefill leg above 50 tokens."""
    prefill, decode = start_fake(procs, "pre"), start_fake(procs, "dec")
    router = start_router(procs, tmp_path, {
        "endpoints": [{"name": "pre", "url": prefill.url, "role": "prefill"},
                      {"name": "dec", "url": decode.url, "role": "decode"}],
        "pd": {"prefill_threshold_tokens": 50}, **cfg})
    return prefill, decode, router


def test_prefill_decode_orchestration(procs, tmp_path):
    prefill, decode, router = pd_fleet(procs, tmp_path, health={"probe_interval_s": 0.2})
    long_prompt = "word " * 100  # ~125 estimated tokens > 50
    status, _, body = raw_post(router.url + "/v1/completions",
                               {"prompt": long_prompt, "max_tokens": 3, "stream": True})
    assert status == 200 and body.count(b"dec:") == 3
    [pre_req] = fake_log(prefill)
    assert pre_req["body"]["kv_transfer_params"]["do_remote_decode"] is True
    assert pre_req["body"]["max_tokens"] == 1 and pre_req["body"]["stream"] is False
    [dec_req] = fake_log(decode)
    params = dec_req["body"]["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_handle"] == "pre-h1"
    assert dec_req["body"]["stream"] is True and dec_req["body"]["max_tokens"] == 3
    def request_id(entry: dict) -> str | None:
        return {k.lower(): v for k, v in entry["headers"].items()}.get("x-request-id")

    assert request_id(pre_req) and request_id(pre_req) == request_id(dec_req)
    # the leg's latency teaches the prefill role's perf model (what sizes that role)
    metrics = urllib.request.urlopen(router.url + "/metrics").read().decode()
    assert 'kvfleet_router_perf_model_evidence{role="prefill",target="ttft"} 1.0' in metrics
    # a short prompt skips prefill; so does a repeat whose prefix the decode node holds
    for prompt in ("short", long_prompt):
        assert raw_post(router.url + "/v1/completions", {"prompt": prompt})[0] == 200
    assert len(fake_log(prefill)) == 1 and len(fake_log(decode)) == 3
    assert "kv_transfer_params" not in fake_log(decode)[-1]["body"]
    # no healthy prefill endpoint: the decode endpoint runs the prompt itself, at once
    control(prefill, healthy=False)
    time.sleep(0.8)
    t0 = time.monotonic()
    assert raw_post(router.url + "/v1/completions", {"prompt": "other " * 100})[0] == 200
    assert time.monotonic() - t0 < 2
    assert len(fake_log(prefill)) == 1 and len(fake_log(decode)) == 4
    assert "kv_transfer_params" not in fake_log(decode)[-1]["body"]
    metrics = urllib.request.urlopen(router.url + "/metrics").read().decode()
    assert 'kvfleet_router_pd_prefills_total{outcome="failed"} 1.0' in metrics


def test_both_pd_legs_carry_the_tenants_priority(procs, tmp_path):
    prefill, decode, router = pd_fleet(
        procs, tmp_path, flow_control={"tenants": {"pager": {"band": "critical"}}})
    status, _, _ = raw_post(router.url + "/v1/completions",
                            {"prompt": "word " * 100, "max_tokens": 3},
                            headers={"x-kvfleet-tenant": "pager"})
    assert status == 200
    [pre_req], [dec_req] = fake_log(prefill), fake_log(decode)
    assert pre_req["body"]["priority"] == -2 and dec_req["body"]["priority"] == -2


def test_precise_prefix_index_from_kv_events(procs, tmp_path):
    backends = [start_fake(procs, f"b{i}") for i in range(3)]
    router = start_router(procs, tmp_path, {
        "endpoints": endpoints_cfg(backends, prefix_mode="precise"),
        "policy": {"name": "prefix-cache"}})
    tokens = list(range(100, 132))
    event = {"seq": 0, "type": "BlockStored", "block_hashes": [11, 12, 13, 14],
             "parent_block_hash": None, "token_ids": tokens, "block_size": 8}
    deadline = time.monotonic() + 10
    while http_json(backends[2].url + "/_fake/kv_events", [event])[1]["num_readers"] == 0:
        assert time.monotonic() < deadline, "router never subscribed to /v1/kv_events"
        time.sleep(0.1)
    time.sleep(0.3)
    for i in range(4):
        assert raw_post(router.url + "/v1/completions",
                        {"prompt": tokens + [i], "max_tokens": 1})[0] == 200
    assert [len(fake_log(b)) for b in backends] == [0, 0, 4]


def test_client_disconnect_releases_the_backend_stream(procs, tmp_path):
    import socket

    backend = start_fake(procs, "b0", "--token-delay-ms", "100")
    router = start_router(procs, tmp_path, {"endpoints": endpoints_cfg([backend])})
    body = json.dumps({"prompt": "x", "max_tokens": 200, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", router.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
        seen = b""
        while b"data:" not in seen:  # headers and the first event may come apart
            chunk = sock.recv(65536)
            assert chunk, "the router closed the connection"
            seen += chunk
    deadline = time.monotonic() + 5
    while http_json(backend.url + "/_fake/log")[1]["num_in_flight"] != 0:
        assert time.monotonic() < deadline, "the backend stream was never released"
        time.sleep(0.1)
    status, got = http_json(router.url + "/admin/config",
                            headers={"Authorization": "Bearer test-admin-token"})
    assert got["endpoints"][0]["num_in_flight"] == 0
    assert raw_post(router.url + "/v1/completions", {"prompt": "after"})[0] == 200


def test_busy_endpoint_is_retried_elsewhere_but_not_ejected(procs, tmp_path):
    busy, good = start_fake(procs, "busy"), start_fake(procs, "good")
    router = start_router(procs, tmp_path, {
        "endpoints": endpoints_cfg([busy, good]), "policy": {"name": "round-robin"},
        "health": {"eject_after_errors": 1}})
    control(busy, num_bad=4, status=503)  # "queue full": overloaded, not broken
    for i in range(8):
        assert raw_post(router.url + "/v1/completions", {"prompt": f"{i}"})[0] == 200
    assert len(fake_log(busy)) == 6  # 4 refusals, then it served its share again
    metrics = urllib.request.urlopen(router.url + "/metrics").read().decode()
    assert "kvfleet_router_ejections_total{" not in metrics
    assert 'kvfleet_router_backend_errors_total{endpoint="b0",kind="busy"} 4.0' in metrics


def test_first_byte_and_idle_timeouts(procs, tmp_path):
    slow = start_fake(procs, "slow", "--token-delay-ms", "1500")
    fast = start_fake(procs, "fast", "--token-delay-ms", "1")
    router = start_router(procs, tmp_path, {
        "endpoints": endpoints_cfg([slow, fast]), "policy": {"name": "round-robin"},
        "timeouts": {"first_byte_s": 0.5, "idle_s": 1.0}})
    t0 = time.monotonic()
    for i in range(2):  # whichever goes first, the slow one times out and the retry lands
        status, _, body = raw_post(router.url + "/v1/completions", {"prompt": f"{i}",
                                                                    "max_tokens": 2})
        assert status == 200 and b"fast:" in body
    assert time.monotonic() - t0 < 5
    metrics = urllib.request.urlopen(router.url + "/metrics").read().decode()
    assert 'kvfleet_router_backend_errors_total{endpoint="b0",kind="timeout"}' in metrics


def test_backend_hanging_mid_stream_hits_the_idle_timeout(procs, tmp_path):
    backend = start_fake(procs, "b0")
    router = start_router(procs, tmp_path, {"endpoints": endpoints_cfg([backend]),
                                            "timeouts": {"idle_s": 1.0}})
    control(backend, stall_after_chunks=2)
    t0 = time.monotonic()
    status, _, body = raw_post(router.url + "/v1/completions",
                               {"prompt": "x", "max_tokens": 5, "stream": True})
    assert status == 200 and body.count(b"b0:") == 2
    events = [e for e in body.split(b"\n\n") if e]
    assert b'"error"' in events[-2] and events[-1] == b"data: [DONE]"
    assert 0.9 < time.monotonic() - t0 < 5


def test_chunked_upload_is_size_limited_too(procs, tmp_path):
    backend = start_fake(procs, "b0")
    router = start_router(procs, tmp_path, {"endpoints": endpoints_cfg([backend]),
                                            "limits": {"max_body_bytes": 1000}})

    def chunked(body: bytes) -> tuple[int, dict]:
        def gen():
            yield body[:10]
            yield body[10:]

        req = urllib.request.Request(router.url + "/v1/completions", data=gen(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Transfer-Encoding": "chunked"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, got = chunked(json.dumps({"prompt": "x" * 2000}).encode())
    assert status == 413 and got["error"]["code"] == "body_too_large"
    status, got = chunked(json.dumps({"prompt": "small", "max_tokens": 2}).encode())
    assert status == 200 and got["choices"][0]["text"] == "b0:0 b0:1 "
