"""The waiting room over HTTP, with real processes: a completion sent to a router that has
no endpoint yet is held (not a 503) and answered once the operator pushes one; the
per-tenant flow metrics count it."""

from __future__ import annotations

import threading
import time
import urllib.request

from router_fixtures import admin_headers, http_json, start_fake, start_router


def test_request_before_any_endpoint_succeeds_once_one_is_pushed(procs, tmp_path):
    backend = start_fake(procs, "b0")
    router = start_router(procs, tmp_path, {"endpoints": [], "queue": {"timeout_s": 20}})
    got: dict[str, object] = {}

    def send() -> None:
        got["answer"] = http_json(router.url + "/v1/completions",
                                  {"model": "fake", "prompt": "hello", "max_tokens": 4},
                                  headers={"x-kvfleet-tenant": "acme"}, timeout_s=30)

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(1.0)
    assert sender.is_alive()  # held in the waiting room, not refused
    status, _ = http_json(router.url + "/admin/config", {
        "version": 1, "endpoints": [{"name": "b0", "url": backend.url}],
        "queue": {"timeout_s": 20}}, method="PUT", headers=admin_headers())
    assert status == 200
    sender.join(15)
    status, body = got["answer"]  # type: ignore[misc]
    assert status == 200, body
    assert body["choices"][0]["text"]  # type: ignore[index]
    with urllib.request.urlopen(router.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert 'kvfleet_router_flow_queued_total{band="standard",tenant="acme"} 1.0' in text
    assert 'kvfleet_router_flow_dispatched_total{band="standard",tenant="acme"} 1.0' in text


def test_queued_requests_survive_flow_control_config_changes(procs, tmp_path):
    """Six requests queue behind a one-seat endpoint; two pushes change the tenants' bands
    and weights, shrink the queue below what it holds and bound a band to zero: every one
    of them is still answered 200 (a push changes what comes next, never what is held)."""
    backend = start_fake(procs, "b0", "--token-delay-ms", "60")  # ~0.25 s a request
    endpoints = [{"name": "b0", "url": backend.url, "capacity": 1}]
    router = start_router(procs, tmp_path, {"endpoints": endpoints, "queue": {"timeout_s": 30}})
    answers: list[tuple[int, object]] = []

    def send(tenant: str) -> None:
        answers.append(http_json(router.url + "/v1/completions",
                                 {"model": "fake", "prompt": f"hello {tenant}", "max_tokens": 4},
                                 headers={"x-kvfleet-tenant": tenant}, timeout_s=60))

    senders = [threading.Thread(target=send, args=(t,)) for t in ("a", "b") * 3]
    for s in senders:
        s.start()
    time.sleep(0.3)
    for version, flow in ((1, {"tenants": {"a": {"band": "sheddable"}, "b": {"weight": 4}},
                               "max_queued_per_band": {"standard": 0}}),
                          (2, {})):
        status, _ = http_json(router.url + "/admin/config", {
            "version": version, "endpoints": endpoints, "flow_control": flow,
            "queue": {"timeout_s": 30, "max_size": 1}}, method="PUT", headers=admin_headers())
        assert status == 200
        time.sleep(0.3)
    for s in senders:
        s.join(30)
    assert sorted(status for status, _ in answers) == [200] * 6, answers
