"""bench/flow_control.py: its pure figures, and a quick isolation run as a smoke test that fails
when the router stops isolating tenants.

The smoke run (`--quick`, ~30 s) starts one simulated-runner engine and a kvfleet router,
runs tenant A alone and then beside tenant B's flood (ten times A's rate, past the pool's
capacity), and checks that A loses nothing and that its TTFT stays within one engine slot's
wait of its figure alone, far below B's. Run once with `--fairness off` (every request one
tenant's, FCFS) it failed: A's TTFT p90 was about 90x its figure alone and A lost requests
to the TTL.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from kvfleet_bench import flow_client, flow_stats
from kvfleet_bench.flow_client import Outcome

REPO = Path(__file__).resolve().parents[2]
HAS_KVFLEET_ROUTER = (REPO / "router" / "kvfleet_router" / "cli.py").exists()


def outcome(tenant="t", status=200, reason="", start=1.0, end=2.0, ttft=0.1, tokens=(10, 5),
            error=None, headers=None) -> Outcome:
    return Outcome(tenant, start, end, ttft, status, reason, tokens[0], tokens[1], error,
                   headers or {})


def test_jain_index():
    assert flow_stats.jain([3, 3, 3]) == pytest.approx(1.0)
    assert flow_stats.jain([1, 0, 0, 0]) == pytest.approx(0.25)
    assert flow_stats.jain([1, 2]) == pytest.approx(0.9)
    with pytest.raises(ValueError):
        flow_stats.jain([])


def test_weighted_shares_compare_each_tenant_with_its_weight():
    shares = flow_stats.weighted_shares({"a": 100, "b": 100, "c": 200, "d": 400},
                                        {"a": 1, "b": 1, "c": 2, "d": 4})
    assert shares["max_rel_error"] == pytest.approx(0.0)
    assert shares["jain_equal_weight"]["1"] == pytest.approx(1.0)
    # equal service regardless of weight: the weight-4 tenant gets half of its share
    flat = flow_stats.weighted_shares({"a": 1, "b": 1, "c": 1, "d": 1},
                                      {"a": 1, "b": 1, "c": 2, "d": 4})
    assert flat["tenants"]["d"]["rel_error"] == pytest.approx(0.5)
    assert flat["max_rel_error"] == pytest.approx(1.0)  # a: 25% against 12.5%
    with pytest.raises(ValueError):
        flow_stats.weighted_shares({}, {"a": 1})


def test_every_outcome_is_served_refused_or_lost():
    runs = [outcome(), outcome(status=429, reason="saturated"),
            outcome(status=503, reason="no-endpoint"), outcome(status=429),  # no reason
            outcome(status=0, reason="ServerDisconnectedError"),
            outcome(status=200, reason="incomplete stream")]
    assert [o.is_ok for o in runs] == [True, False, False, False, False, False]
    assert [o.is_unexplained for o in runs] == [False, False, False, True, True, True]
    counts = flow_stats.outcome_counts(runs)
    assert counts["ok"] == 1 and counts["429 saturated"] == 1 and counts["503 no-endpoint"] == 1
    assert sum(counts.values()) == len(runs)


def test_window_splits_latency_by_start_and_throughput_by_end():
    runs = [outcome(start=0.5, end=1.5, ttft=9.0),  # started in warm-up: no latency sample
            outcome(start=1.5, end=3.5, ttft=0.2),  # ended after the window: not served in it
            outcome(start=2.0, end=2.5, ttft=0.1)]
    s = flow_stats.tenant_summary(runs, "t", 1.0, 3.0)
    assert s["num_ttft_samples"] == 2 and s["ttft_p90_ms"] == pytest.approx(200)
    assert s["served_tokens"] == 30 and s["served_rps"] == pytest.approx(1.0)
    assert s["num_requests"] == 3


def test_quota_check_and_refusal_shape():
    runs = [outcome(tenant="q", start=i) for i in range(10)]
    runs += [outcome(tenant="q", status=429, reason="quota-requests", start=i + 0.5)
             for i in range(5)]
    check = flow_stats.quota_check(runs, "q", 0, 60, rpm=10)
    assert check["served_over_limit"] == pytest.approx(1.0) and check["num_429"] == 5
    tokens = flow_stats.quota_check(runs, "q", 0, 30, tpm=300)
    assert tokens["served_over_limit"] == pytest.approx(150 / 150)
    good = outcome(status=429, reason="quota-requests", error={
        "message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"},
        headers={"retry-after": "1", "x-ratelimit-limit-requests": "10",
                 "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6s"})
    assert all(flow_stats.is_openai_rate_limit(good, "requests").values())
    shape = flow_stats.is_openai_rate_limit(good, "tokens")
    assert not shape["type_matches"] and not shape["has_x_ratelimit_headers"]


def test_refusal_reason_comes_from_the_drop_header_or_the_openai_error():
    body = json.dumps({"error": {"message": "m", "type": "tokens",
                                 "code": "rate_limit_exceeded"}}).encode()
    assert flow_client._refusal(429, {}, body)[0] == "quota-tokens"
    assert flow_client._refusal(429, {"x-kvfleet-drop-reason": "queue-full"}, b"")[0] == \
        "queue-full"
    assert flow_client._refusal(502, {}, b"not json") == ("http 502", None)


def test_prompts_share_no_leading_block_and_have_the_asked_length():
    a, b = flow_client.prompt_text("A", 1, 256), flow_client.prompt_text("A", 2, 256)
    assert len(a) == len(b) == 256 and a[:16] != b[:16]
    with pytest.raises(ValueError):
        flow_client.TenantLoad("x", rate=1.0, concurrency=2)


@pytest.mark.skipif(not HAS_KVFLEET_ROUTER, reason="kvfleet router not in this build")
def test_flow_control_quick_isolates_a_light_tenant_from_a_flood(tmp_path):
    out = tmp_path / "flow.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "flow_control.py"), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    iso = result["figures"]["isolation"]
    row = result["reps"]["isolation"][0]
    a, b = row["flood"]["tenants"]["A"], row["flood"]["tenants"]["B"]
    assert result["num_unexplained"] == 0, row
    assert iso["a_lost"] == 0, a["outcomes"]
    assert b["num_refused"] > 0, b["outcomes"]  # the flood was past the pool's capacity
    # B's flood waits seconds in the queue; A goes to its head and waits one slot at most
    assert not math.isnan(a["ttft_p90_ms"])
    assert a["ttft_p90_ms"] < b["ttft_p50_ms"] / 2, (a, b)
    # at the queue's head A waits for one engine slot: at most about one flood request's
    # time in the slot after its first token (B's decode time), not B's backlog
    alone = row["alone"]["tenants"]["A"]["ttft_p90_ms"]
    assert a["ttft_p90_ms"] <= alone + 2 * b["decode_p50_ms"], (alone, a, b)
