"""Request migration, live: a greedy stream whose engine is SIGKILLed (or hangs) mid-answer
arrives whole and token-exact against an uninterrupted run.

Engines: `kvfleet engine --runner simulated` processes. Their tokens are a function of the
whole sequence so far (sim_runner.py's rolling hash, as a model's are), and their steps
sleep the profile's time, so a stream lasts long enough to be killed mid-answer.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from engine_fleet import SIMULATED, metric_sum, start_engines
from router_fixtures import endpoints_cfg, sse_post, sse_text, start_router

MAX_TOKENS = 120
COMPLETION = {"model": "tiny-random", "prompt": "The fleet keeps every stream alive",
              "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
              "stream": True, "stream_options": {"include_usage": True}}
CHAT = {"model": "tiny-random", "max_tokens": MAX_TOKENS, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Tell me about request migration."}]}


def _serving(engines: list[Any]) -> Any:
    """The engine with a request running."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for e in engines:
            if metric_sum(e.url, "vllm:num_requests_running") > 0:
                return e
        time.sleep(0.01)
    raise AssertionError("no engine is running the request")


@pytest.fixture
def fleet(procs, tmp_path):
    engines = start_engines(procs, [SIMULATED] * 3)

    def router(**cfg: Any) -> Any:
        return start_router(procs, tmp_path, {
            "endpoints": endpoints_cfg(engines), "policy": {"name": "least-request"},
            "health": {"probe_interval_s": 0.5}, **cfg})
    return engines, router


def _whole(events: list[Any], is_chat: bool) -> None:
    """One stream, as an uninterrupted one looks: a single role header, no error,
    one finish, the usage, then [DONE] once at the end."""
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    bodies = [e for e in events if e != "[DONE]"]
    assert not any("error" in e for e in bodies)
    assert len({e["id"] for e in bodies}) == 1
    finishes = [e["choices"][0]["finish_reason"] for e in bodies if e.get("choices")]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    if is_chat:
        roles = [e for e in bodies if e.get("choices") and "role" in e["choices"][0]["delta"]]
        assert len(roles) == 1
    for e in bodies:  # the ids the router asked for are not shown to this client
        assert "prompt_token_ids" not in e
        assert all("token_ids" not in c for c in e.get("choices") or ())


@pytest.mark.parametrize("is_chat", [False, True], ids=["completions", "chat"])
def test_a_killed_engines_stream_continues_token_exact(fleet, is_chat):
    engines, start = fleet
    router = start()
    path, body = ("/v1/chat/completions", CHAT) if is_chat else ("/v1/completions", COMPLETION)
    reference = sse_post(router.url, path, body)
    _whole(reference, is_chat)

    killed: list[Any] = []

    def kill_at_20(i: int) -> None:
        if i == 20:
            victim = _serving(engines)
            os.kill(victim.pid, signal.SIGKILL)
            killed.append(victim)

    migrated = sse_post(router.url, path, body, kill_at_20)
    assert killed, "the stream ended before the kill"
    _whole(migrated, is_chat)
    assert sse_text(migrated, is_chat) == sse_text(reference, is_chat)
    assert migrated[-2]["usage"]["completion_tokens"] == MAX_TOKENS
    assert migrated[-2]["usage"]["prompt_tokens"] == reference[-2]["usage"]["prompt_tokens"]
    assert metric_sum(router.url, "kvfleet_router_migrations_total",
                      outcome="continued") == 1


def test_a_hung_engines_stream_continues_after_the_idle_timeout(fleet):
    engines, start = fleet
    router = start(timeouts={"idle_s": 1.0})
    reference = sse_post(router.url, "/v1/completions", COMPLETION)
    stopped: list[Any] = []

    def stop_at_20(i: int) -> None:
        if i == 20:
            victim = _serving(engines)
            os.kill(victim.pid, signal.SIGSTOP)
            stopped.append(victim)

    try:
        t0 = time.monotonic()
        migrated = sse_post(router.url, "/v1/completions", COMPLETION, stop_at_20)
        assert stopped
        assert time.monotonic() - t0 < 30
    finally:
        for victim in stopped:
            os.kill(victim.pid, signal.SIGCONT)
    _whole(migrated, False)
    assert sse_text(migrated, False) == sse_text(reference, False)


def test_without_migration_the_stream_ends_in_an_error_event(fleet):
    """The behaviour migration replaces, and what `migration.enabled: false` keeps."""
    engines, start = fleet
    router = start(migration={"enabled": False})

    def kill_at_20(i: int) -> None:
        if i == 20:
            os.kill(_serving(engines).pid, signal.SIGKILL)

    events = sse_post(router.url, "/v1/completions", COMPLETION, kill_at_20)
    assert any(e != "[DONE]" and "error" in e for e in events)
    assert metric_sum(router.url, "kvfleet_router_migrations_total") == 0


def test_a_refused_continuation_ends_the_stream_and_blames_no_endpoint(procs, tmp_path):
    """A continuation answered 4xx (the request's own fault: here the fake says so) is
    never the endpoint's fault and no other endpoint would take it: the stream ends in an
    error event at once, `failed` is counted, and the refusing endpoint is not charged."""
    from router_fixtures import http_json, start_fake

    fakes = [start_fake(procs, f"b{i}", "--token-delay-ms", "100", "--num-tokens", "40")
             for i in range(2)]
    router = start_router(procs, tmp_path, {"endpoints": endpoints_cfg(fakes),
                                            "policy": {"name": "least-request"}})
    body = {"model": "fake", "prompt": "x", "max_tokens": 40, "stream": True}
    state: dict[str, Any] = {}

    def break_at_3(i: int) -> None:
        if i != 3:
            return
        logs = [http_json(f.url + "/_fake/log")[1]["log"] for f in fakes]
        serving = 0 if logs[0] else 1
        other = fakes[1 - serving]
        assert http_json(other.url + "/_fake/control", {
            "num_bad": 1, "status": 400, "error_code": "caused_by_request"})[0] == 200
        state["other"] = f"b{1 - serving}"
        fakes[serving].kill()

    events = sse_post(router.url, "/v1/completions", body, break_at_3)
    errors = [e for e in events if e != "[DONE]" and "error" in e]
    assert len(errors) == 1 and "refused" in errors[0]["error"]["message"]
    assert metric_sum(router.url, "kvfleet_router_migrations_total", outcome="failed") == 1
    assert metric_sum(router.url, "kvfleet_router_backend_errors_total",
                      endpoint=state["other"]) == 0
