"""Router replicas that route as one (exchange.py), as real router processes.

Two routers of one pool (same admin token, so the same hash seed) in front of four fake
backends: a prompt placed by one is placed on the same backend by the other; one replica's
in-flight requests count on the other's endpoints; a frozen peer (a partition) costs the
other nothing; a replica that starts warms from a peer; a router of another pool (another
token) is refused. Each fake backend names itself in its answer, so where a request went
is read from the answer's text.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from router_fixtures import (
    ADMIN_TOKEN,
    admin_headers,
    endpoints_cfg,
    http_json,
    start_fake,
    start_router,
)

NUM_PROMPTS = 8


def prompt(i: int) -> str:
    # long enough for many 64-byte blocks, distinct from the first byte
    return f"conversation {i:03d}: " + f"turn text {i} " * 60


def served_by(router_url: str, text: str) -> str:
    status, body = http_json(router_url + "/v1/completions",
                             {"model": "fake", "prompt": text, "max_tokens": 4})
    assert status == 200, body
    return body["choices"][0]["text"].split(":", 1)[0].strip()


def push_config(router_url: str, cfg: dict[str, Any]) -> None:
    status, body = http_json(router_url + "/admin/config", cfg, method="PUT",
                             headers=admin_headers())
    assert status == 200, body


def exchange_cfg(backends: list[Any], peers: list[str], version: int = 1,
                 **extra: Any) -> dict[str, Any]:
    return {"version": version, "endpoints": endpoints_cfg(backends),
            "exchange": {"enabled": True, "peers": peers, "interval_s": 0.05,
                         "stale_after_s": 0.5, "timeout_s": 0.3, **extra}}


def metric(router_url: str, name: str) -> float:
    with urllib.request.urlopen(router_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(check: Any, timeout_s: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def peer_in_flight(router_url: str) -> dict[str, float]:
    _, body = http_json(router_url + "/admin/config", headers=admin_headers())
    return {e["name"]: e["peer_in_flight"] for e in body["endpoints"]}


def two_replicas(procs: Any, tmp_path: Path, exchange: bool = True,
                 slow_backend: bool = False) -> tuple[list[Any], Any, Any]:
    extra = ("--token-delay-ms", "300") if slow_backend else ()
    backends = [start_fake(procs, f"b{i}", *extra) for i in range(4)]
    a = start_router(procs, tmp_path, {"endpoints": endpoints_cfg(backends)})
    b = start_router(procs, tmp_path, {"endpoints": endpoints_cfg(backends)})
    if exchange:
        push_config(a.url, exchange_cfg(backends, [b.url]))
        push_config(b.url, exchange_cfg(backends, [a.url]))
    return backends, a, b


def test_a_prompt_placed_by_one_replica_is_placed_alike_by_the_other(procs, tmp_path):
    _, a, b = two_replicas(procs, tmp_path)
    placed = {i: served_by(a.url, prompt(i)) for i in range(NUM_PROMPTS)}
    assert len(set(placed.values())) > 1  # a random tie-break spread them
    wait_for(lambda: metric(b.url, "kvfleet_router_exchange_received_total{kind=\"batches\"")
             >= 1)
    time.sleep(0.2)
    # the next turn of each conversation reaches the other replica (a new connection
    # through the Service): it goes where the first replica put the conversation
    again = {i: served_by(b.url, prompt(i) + " and the next turn") for i in placed}
    assert again == placed


def test_without_the_exchange_the_other_replica_places_conversations_anew(procs, tmp_path):
    """The control for the test above: what it measures is the exchange, not chance."""
    _, a, b = two_replicas(procs, tmp_path, exchange=False)
    placed = {i: served_by(a.url, prompt(i)) for i in range(NUM_PROMPTS)}
    again = {i: served_by(b.url, prompt(i) + " and the next turn") for i in placed}
    assert again != placed


def test_in_flight_requests_of_one_replica_count_on_the_other(procs, tmp_path):
    backends, a, b = two_replicas(procs, tmp_path, slow_backend=True)
    threads = [threading.Thread(target=served_by, args=(a.url, prompt(i)))
               for i in range(3)]
    for t in threads:
        t.start()
    seen = wait_for(lambda: sum(peer_in_flight(b.url).values()) >= 3, timeout_s=1.0)
    assert seen, peer_in_flight(b.url)
    assert sum(peer_in_flight(a.url).values()) == 0  # B has sent nothing anywhere
    for t in threads:
        t.join()
    assert wait_for(lambda: sum(peer_in_flight(b.url).values()) == 0, timeout_s=1.0)


def test_a_frozen_peer_costs_the_other_replica_nothing(procs, tmp_path):
    """A partition: B stops answering (SIGSTOP). A keeps serving at once, counts its failed
    pushes, and stops counting B's in-flight requests after stale_after_s."""
    backends, a, b = two_replicas(procs, tmp_path, slow_backend=True)
    t = threading.Thread(target=served_by, args=(b.url, prompt(0)))
    t.start()
    assert wait_for(lambda: sum(peer_in_flight(a.url).values()) == 1, timeout_s=1.0)
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        errors_before = metric(a.url, 'kvfleet_router_exchange_pushes_total{outcome="error"}')
        for i in range(1, 4):
            started = time.monotonic()
            served_by(a.url, prompt(i))
            assert time.monotonic() - started < 3.0  # 4 tokens x 0.3 s; no exchange wait
        assert wait_for(lambda: sum(peer_in_flight(a.url).values()) == 0, timeout_s=1.0)
        assert metric(a.url, 'kvfleet_router_exchange_pushes_total{outcome="error"}') \
            > errors_before
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
        t.join()


def test_a_replica_that_starts_warms_from_a_peer(procs, tmp_path):
    backends = [start_fake(procs, f"b{i}") for i in range(4)]
    a = start_router(procs, tmp_path, {"endpoints": endpoints_cfg(backends)})
    placed = {i: served_by(a.url, prompt(i)) for i in range(NUM_PROMPTS)}
    assert len(set(placed.values())) > 1
    push_config(a.url, exchange_cfg(backends, []))
    c = start_router(procs, tmp_path, exchange_cfg(backends, [a.url]))
    assert wait_for(lambda: metric(c.url, "kvfleet_router_exchange_warm_blocks") > 0)
    again = {i: served_by(c.url, prompt(i) + " and the next turn") for i in placed}
    assert again == placed


def test_the_exchange_refuses_a_peer_without_the_pools_token(procs, tmp_path):
    backends, a, b = two_replicas(procs, tmp_path)
    batch = {"id": "intruder", "group": "intruder", "fingerprint": 0, "block_bytes": 64,
             "relay": False, "records": {}, "in_flight": {"b0": 1000}, "sessions": {}}
    req = urllib.request.Request(a.url + "/admin/exchange", data=json.dumps(batch).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer not-the-token"})
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("an unauthenticated batch was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401
        assert json.loads(exc.read())["error"]["code"] == "unauthorized"
    assert peer_in_flight(a.url)["b0"] == 0
    status, _ = http_json(a.url + "/admin/exchange/snapshot")
    assert status == 401
    # with the token but another hash seed (another pool): 409, nothing applied
    status, body = http_json(a.url + "/admin/exchange", batch, method="POST",
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 409 and "PYTHONHASHSEED" in body["error"]["message"]
    assert peer_in_flight(a.url)["b0"] == 0
    assert metric(a.url, "kvfleet_router_exchange_refused_batches_total") == 1
