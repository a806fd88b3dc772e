"""A pod of workers (`kvfleet router --workers 2`) answers GET /admin/config and GET /metrics
on its public port as one router (worker_views.py); each worker's private port answers for
itself. Real processes where the pod is the point; the merges themselves as pure functions.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import pytest
from kvfleet_engine.contract import parse_text
from kvfleet_operator.runtimes import router_control
from kvfleet_operator.runtimes.router_control import HttpRouterControl
from kvfleet_router.worker_views import (
    VIEW_TIMEOUT_S,
    merge_config_views,
    merge_metrics,
    sibling_indexes,
)
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from router_fixtures import ADMIN_TOKEN, admin_headers, endpoints_cfg, http_json, start_fake
from test_router_workers import served_by, start_workers, wait_for, workers_of

REQUESTS = "kvfleet_router_requests_total"


def metrics_of(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def requests_by_worker(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in parse_text(text, only=[REQUESTS]).samples:
        key = s.labels.get("worker", "")
        out[key] = out.get(key, 0.0) + s.value
    return out


def in_flight(url: str) -> dict[str, Any]:
    status, body = http_json(url + "/admin/config", headers=admin_headers())
    assert status == 200, body
    return body


def hold_stream(url: str, started: threading.Event, prompt: str) -> threading.Thread:
    """A streamed completion of a slow backend, sent to `url`; `started` once its first
    bytes came (the router counts it in flight from before that until it ends)."""
    def run() -> None:
        req = urllib.request.Request(
            url + "/v1/completions", method="POST",
            data=(b'{"model": "fake", "max_tokens": 80, "stream": true, "prompt": "'
                  + prompt.encode() + b'"}'),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                resp.readline()
                started.set()
                resp.read()
        except (OSError, http.client.HTTPException):
            pass  # the test ended and its processes with it

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# --- real processes ---

def test_in_flight_on_both_workers_is_summed_in_one_view_and_by_the_operator(procs, tmp_path):
    # 80 tokens 100 ms apart: each stream stays in flight ~8 s, past the test's checks
    slow = start_fake(procs, "slow", "--token-delay-ms", "100", "--num-tokens", "80")
    router = start_workers(procs, tmp_path, {"endpoints": endpoints_cfg([slow])})
    (_, url0), (_, url1) = workers_of(router)
    events = [threading.Event() for _ in range(3)]
    # two held by worker 0, one by worker 1 (their private ports pick the worker)
    for i, (url, ev) in enumerate(zip([url0, url0, url1], events, strict=True)):
        hold_stream(url, ev, f"held {i}")
    assert all(ev.wait(15) for ev in events)
    own = [in_flight(u)["endpoints"][0]["num_in_flight"] for u in (url0, url1)]
    assert own == [2, 1]  # each private port answers for its worker alone

    # each worker alone counts its sibling's streams as a peer's...
    wait_for("the workers to hear each other", lambda: [
        in_flight(u)["endpoints"][0]["peer_in_flight"] for u in (url0, url1)] == [1, 2],
        timeout_s=5)
    pod = in_flight(router.url)  # whichever worker the connection landed on
    (e,) = pod["endpoints"]
    assert pod["workers"] == 2 and e["name"] == "b0" and e["num_in_flight"] == 3, pod
    # ...which the pod's num_in_flight already sums: its peer_in_flight is other pods' only
    assert e["peer_in_flight"] == 0 and e["is_healthy"] and e["state"] == "active"

    async def operator_view() -> Any:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            return await HttpRouterControl(s, [router.url], ADMIN_TOKEN).view()

    view = asyncio.run(operator_view())
    assert view is not None and view.endpoints["b0"].num_in_flight == 3, view


def test_a_frozen_sibling_makes_the_pod_view_503_within_the_timeout(procs, tmp_path):
    backend = start_fake(procs, "b0")
    router = start_workers(procs, tmp_path, {"endpoints": endpoints_cfg([backend])})
    (_, url0), (pid1, url1) = workers_of(router)
    os.kill(pid1, signal.SIGSTOP)
    try:
        # a connection the kernel hands to the frozen worker hangs; one that reaches worker
        # 0 must come back 503 in VIEW_TIMEOUT_S, never 200 with worker 0's counts alone.
        # 16 new connections: all 16 on the frozen one has odds 2^-16
        def one(_: int) -> tuple[int | None, float]:
            t0 = time.monotonic()
            try:
                status, body = http_json(router.url + "/admin/config",
                                         headers=admin_headers(), timeout_s=VIEW_TIMEOUT_S + 3)
            except (urllib.error.URLError, TimeoutError, OSError):
                return None, time.monotonic() - t0
            assert status != 503 or body["error"]["code"] == "worker_unavailable", body
            return status, time.monotonic() - t0

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(one, range(16)))
        answered = [(s, dt) for s, dt in answers if s is not None]
        assert answered and all(s == 503 for s, _ in answered), answers
        assert all(VIEW_TIMEOUT_S - 0.2 < dt < VIEW_TIMEOUT_S + 1.5 for _, dt in answered)
        # the live worker's own view still answers on its private port
        assert in_flight(url0)["worker"]["index"] == 0
    finally:
        os.kill(pid1, signal.SIGCONT)
    # thawed, the pod answers whole again
    assert wait_for("the pod view", lambda: in_flight(router.url)["workers"] == 2)


def test_metrics_on_the_public_port_count_the_whole_pod(procs, tmp_path):
    backend = start_fake(procs, "b0")
    router = start_workers(procs, tmp_path, {"endpoints": endpoints_cfg([backend])})
    (_, url0), (_, url1) = workers_of(router)
    num_requests = 40
    for i in range(num_requests):  # a new connection each: both workers serve some
        assert served_by(router.url, f"hello {i}") == "b0"
    per_worker = [requests_by_worker(metrics_of(u))[""] for u in (url0, url1)]
    assert all(n > 0 for n in per_worker) and sum(per_worker) == num_requests, per_worker

    text = metrics_of(router.url)
    assert requests_by_worker(text) == {"0": per_worker[0], "1": per_worker[1]}
    # one well-formed exposition: each family once, every sample labelled by its worker
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names))
    up = {s.labels["worker"]: s.value for f in families if f.name == "kvfleet_router_worker_up"
          for s in f.samples}
    assert up == {"0": 1.0, "1": 1.0}
    assert all(s.labels.get("worker") in ("0", "1") for f in families for s in f.samples)
    queue = parse_text(text, only=["kvfleet_router_queue_length"]).samples
    assert sorted(s.labels["worker"] for s in queue) == ["0", "1"]


# --- the merges, without processes ---

def _view(version: int, xid: str, endpoints: list[dict[str, Any]],
          peers: dict[str, dict[str, float]], revisions: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    return {"version": version, "config": {"version": version}, "endpoints": endpoints,
            "revisions": revisions or {},
            "worker": {"index": 0, "exchange_id": xid, "peers_in_flight": peers}}


def _ep(name: str, n: int, state: str = "active", healthy: bool = True,
        peer: float = 0.0) -> dict[str, Any]:
    return {"name": name, "url": f"http://{name}", "role": "unified", "revision": "",
            "state": state, "num_in_flight": n, "peer_in_flight": peer, "is_healthy": healthy}


def test_config_merge_sums_in_flight_and_counts_only_other_pods_as_peers():
    a = _view(4, "A", [_ep("e0", 2, peer=8), _ep("e1", 0, state="draining")],
              {"B": {"e0": 1}, "R1": {"e0": 5}, "R2": {"e0": 2}},
              {"v1": {"requests": 3, "errors": 1}})
    b = _view(3, "B", [_ep("e0", 1, peer=9, healthy=False), _ep("e1", 4)],
              {"A": {"e0": 2}, "R1": {"e0": 5}, "R2": {"e0": 3}},
              {"v1": {"requests": 2, "errors": 0}, "v2": {"requests": 1, "errors": 1}})
    merged = merge_config_views([a, b])
    by = {e["name"]: e for e in merged["endpoints"]}
    assert by["e0"]["num_in_flight"] == 3 and by["e1"]["num_in_flight"] == 4
    # remote routers R1, R2 only (siblings A, B dropped), the most any worker heard
    assert by["e0"]["peer_in_flight"] == 8.0 and by["e1"]["peer_in_flight"] == 0.0
    assert by["e0"]["is_healthy"] is False  # healthy only where healthy in every worker
    assert by["e1"]["state"] == "active"  # worker B still sends there: not drained yet
    assert merged["version"] == 3 and merged["config"] == {"version": 3}  # the oldest
    assert merged["workers"] == 2
    assert merged["revisions"]["v1"]["requests"] == 5 and merged["revisions"]["v1"]["errors"] == 1
    assert merged["revisions"]["v2"]["requests"] == 1


def test_config_merge_refuses_a_view_without_its_worker_block():
    bad = _view(1, "A", [_ep("e0", 1)], {})
    del bad["worker"]
    with pytest.raises(KeyError):
        merge_config_views([_view(1, "B", [_ep("e0", 1)], {}), bad])


def worker_text(n: int, q: float) -> str:
    """What a worker's prometheus_client renders: a counter (with its _created family), a
    gauge, a histogram."""
    r = CollectorRegistry()
    Counter("kvfleet_router_requests", "routed requests", ["endpoint"], registry=r) \
        .labels("e0").inc(n)
    Gauge("kvfleet_router_queue_length", "waiting requests", registry=r).set(q)
    h = Histogram("kvfleet_router_decision_seconds", "decision latency", registry=r,
                  buckets=(0.001,))
    for _ in range(n):
        h.observe(0.0005)
    return generate_latest(r).decode()


def test_metrics_merge_labels_every_sample_and_keeps_families_whole():
    text = merge_metrics([(0, worker_text(3, 2.0)), (2, worker_text(5, 1.0))], down=[1])
    families = {f.name: f for f in text_string_to_metric_families(text)}
    reqs = families["kvfleet_router_requests"].samples
    assert {(s.labels["worker"], s.name, s.value) for s in reqs if s.name.endswith("_total")} \
        == {("0", REQUESTS, 3.0), ("2", REQUESTS, 5.0)}
    hist = [s for s in families["kvfleet_router_decision_seconds"].samples
            if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"]
    assert sorted((s.labels["worker"], s.value) for s in hist) == [("0", 3.0), ("2", 5.0)]
    assert {s.labels["worker"]: s.value for s in families["kvfleet_router_worker_up"].samples} \
        == {"0": 1.0, "1": 0.0, "2": 1.0}
    assert text.count("# TYPE kvfleet_router_queue_length gauge") == 1
    # the operator's readers sum a pod's workers (a worker label or none)
    assert router_control.queue_length_in(text) == 3
    assert router_control.queue_length_in(worker_text(1, 4.0)) == 4


def test_metrics_merge_labels_a_sample_with_empty_braces_and_one_without():
    text = merge_metrics([(1, 'a_total{} 1\nb 2 1700000000\n')])
    assert 'a_total{worker="1"} 1' in text and 'b{worker="1"} 2 1700000000' in text


def test_sibling_indexes_skip_this_worker():
    assert sibling_indexes(0, 2) == [1, 2]
    assert sibling_indexes(1, 2) == [0, 2]
    assert sibling_indexes(2, 2) == [0, 1]


def _perf_text(weight: float, evidence: int) -> str:
    from kvfleet_router.perf_model import TPOT_FEATURES, TTFT_FEATURES

    lines = []
    for target, names in (("ttft", TTFT_FEATURES), ("tpot", TPOT_FEATURES)):
        lines += [f'kvfleet_router_perf_model_coefficient{{role="unified",target="{target}",'
                  f'feature="{f}"}} {weight}' for f in names]
        lines.append(f'kvfleet_router_perf_model_evidence{{role="unified",target="{target}"}} '
                     f'{evidence}')
    return "\n".join(lines) + "\n"


def test_the_operator_combines_a_pods_workers_perf_models_by_evidence():
    text = merge_metrics([(0, _perf_text(1.0, 1)), (1, _perf_text(4.0, 3))])
    fit = router_control.perf_models_in(text)["unified"]
    assert fit.num_ttft_samples == 4 and fit.num_tpot_samples == 4
    assert all(w == pytest.approx(3.25) for w in (*fit.ttft, *fit.tpot))  # (1*1 + 3*4) / 4
    # one process's text (no worker label) reads as before
    assert router_control.perf_models_in(_perf_text(2.0, 5))["unified"].ttft[0] == 2.0
